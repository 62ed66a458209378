"""The gateway's own browser-login endpoints, as twisted.web Resources."""
