"""
The Go ServeMux: pattern grammar, path cleaning, conflicts and the routing tree.

Pure logic with no Twisted imports, so that configuration loading can use it.
"""
