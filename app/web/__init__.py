"""The server-rendered dashboard: templates, filters, charts."""
