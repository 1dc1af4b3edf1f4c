"""The two-pass pipeline `prepare` writes OUT through and `validate` checks raw input through
(prefdata.pipeline.shards): one path on every engine and worker count (one worker: this process)."""
