"""placeholder"""
OPS = ()
