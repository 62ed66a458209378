"""Who the caller is: principals, session cookies, tokens and assertions."""
