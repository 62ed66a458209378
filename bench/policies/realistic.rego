# python -m bench authz, variant d: a policy of a realistic size, about twenty deny rules
# over the request (method, path, route, route name, labels) and the caller (subject,
# groups, claims). None of them denies the benchmark's anonymous GET /x on a route
# labelled {tier: edge, team: platform, env: bench}; each denies something else.
#
# (No sprintf of a possibly empty string: rego-cpp renders "" as a bare "" inside the
# result, which is then not valid JSON.)
package gw.authz

import rego.v1

allowed_methods := {"GET", "HEAD", "POST", "PUT", "PATCH", "OPTIONS"}

write_methods := {"POST", "PUT", "PATCH", "DELETE"}

admin_prefixes := ["/admin", "/internal", "/debug", "/metrics"]

refused_suffixes := [".php", ".asp", ".env", ".git", ".bak", ".sql"]

method := input.request.method

path := input.request.path

labels := input.request.labels

anonymous if input.subject == ""

admin if "admin" in input.groups

route_method := parts[0] if {
	parts := split(input.request.route, " ")
	count(parts) == 2
}

deny contains "DELETE is not allowed" if method == "DELETE"

deny contains msg if {
	not method in allowed_methods
	msg := sprintf("method %s is not allowed", [method])
}

deny contains msg if {
	some prefix in admin_prefixes
	startswith(path, prefix)
	not admin
	msg := sprintf("%s is for admins only", [prefix])
}

deny contains msg if {
	some suffix in refused_suffixes
	endswith(path, suffix)
	msg := sprintf("paths ending in %s are refused", [suffix])
}

deny contains "path too long" if count(path) > 2048

deny contains "dot segment in path" if {
	some segment in split(path, "/")
	startswith(segment, ".")
}

deny contains "empty segment in path" if contains(path, "//")

deny contains "uppercase letters in path" if regex.match(`[A-Z]`, path)

deny contains "method does not match the route" if {
	route_method != method
	not head_on_get
}

head_on_get if {
	route_method == "GET"
	method == "HEAD"
}

deny contains "route is retired" if input.request.route_name in {"legacy", "deprecated"}

deny contains "route has no owning team" if not labels.team

deny contains "route has no tier" if not labels.tier

deny contains msg if {
	tier := labels.tier
	not tier in {"edge", "api", "app"}
	msg := sprintf("unknown tier %s", [tier])
}

deny contains "route under maintenance" if labels.maintenance == "true"

deny contains "writes are refused on read-only routes" if {
	method in write_methods
	labels.readonly == "true"
}

deny contains "anonymous writes are refused in production" if {
	labels.env == "prod"
	anonymous
	method in write_methods
}

deny contains "internal routes need the ops group" if {
	labels.tier == "internal"
	not "ops" in input.groups
}

deny contains "suspended account" if input.claims.suspended == true

deny contains "banned group" if {
	some group in input.groups
	group in {"banned", "blocked"}
}

deny contains "tenant mismatch" if {
	input.claims.tenant != labels.tenant
}

deny contains "too many groups" if count(input.groups) > 64

deny contains "API writes need a subject" if {
	startswith(path, "/api/")
	method in write_methods
	anonymous
}
