"""Serving engines: their profiles (what each builds at load time) and their plugins (SGLang)."""
