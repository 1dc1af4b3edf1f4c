"""Stage 4: findings collected into report.json (builder), then rendered (text, Markdown, HTML, GitHub)."""
