"""How the controller talks to one node: the `Transport` protocol (base.py), this machine
(local.py), SSH with pinned host keys (ssh.py), and the tar streams both use (tar.py).
"""
