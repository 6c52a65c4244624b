"""Helpers the tests share that are neither fixtures nor agents: a throwaway PostgreSQL cluster
(``pg``) and scripted model providers on loopback (``fakes``)."""
