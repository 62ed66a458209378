"""
Request and response plugins: the extension points, their discovery, the per-route
stages that run them, the manifest of plugin modules, and the plugins edgegw ships.
"""
