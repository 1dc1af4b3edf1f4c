"""Stage 4: findings collected (builder, with compact, distributions, similarity), laid out as report.json
(sections, baseline), then rendered (render_text, render_markdown, render_html with svg, render_github)."""
