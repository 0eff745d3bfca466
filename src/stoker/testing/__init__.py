"""Real parts for tests, benchmarks and the demo: a SeaweedFS S3 server on loopback, a
delaying (and fault-injecting) TCP proxy, and generated image data."""
