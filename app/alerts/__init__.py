"""Alerts (docs/alerts.md): rules over the waste analysis's states, incidents, an outbox of messages, snoozes and
the optional stop action."""
