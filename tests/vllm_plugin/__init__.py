"""The vLLM plugin tests. A package, so that its conftest is imported as ``vllm_plugin.conftest``, apart from
``tests/conftest.py`` (which its modules still import as ``conftest``)."""
