"""Authorization: Policy resources (built-in require rules and Rego) and their evaluation."""
