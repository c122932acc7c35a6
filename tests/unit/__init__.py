"""The unit tests, one folder per room of the product (tests/unit/repo/test_tests.py says which).

Every folder here is a package, so that two rooms may each hold a `test_protocol.py` or a
`test_serving.py`: pytest imports them as `tests.unit.<room>.test_<module>`."""
