"""
Regression tests for the findings of the independent review of browser login: each module
reproduces one attack and checks that the gateway now refuses it.
"""
