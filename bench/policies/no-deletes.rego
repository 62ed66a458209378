# python -m bench authz, variants b and c: one rule, which allows the benchmark's
# GET /x (it denies only DELETE).
package gw.authz

import rego.v1

deny contains "DELETE is not allowed" if input.request.method == "DELETE"
