"""Online DPO: generate with the policy, score, pair best vs worst, then prepare -> refs -> train."""
