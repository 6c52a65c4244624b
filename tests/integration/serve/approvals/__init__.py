"""Interrupts end to end: approvals, questions, custom interrupts, the approvals workflow (events, inbox, expiry, grants, keys) and a served ReActAgent."""
