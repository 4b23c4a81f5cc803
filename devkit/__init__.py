"""Development support for mtpstack: not shipped in the wheel.

What the tests and the benchmark scripts share lives here: the demo-model tooling (`devkit.demo`),
a scripted OpenAI upstream that counts its own concurrency (`devkit.fake_upstream`), a fleet of
them behind a real proxy process (`devkit.fake_fleet`), the hostile-input generators
(`devkit.hostile`) and raw-socket HTTP clients (`devkit.raw_http`). Import it from a checkout (the repository root on
`sys.path`: `python -m pytest` and `python -m devkit...` from the root do that; scripts under
`bench/scripts/` add it themselves).
"""
