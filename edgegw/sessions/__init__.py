"""Server-side sessions: records in the state store, silent refresh, ended-session streams."""
