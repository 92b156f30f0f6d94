# A stand-in for the clockd image's python:3.11 slim base, built on the local Debian bookworm base
# (tests/e2e cannot pull from a registry): Python 3.11 with a venv whose pip is first on PATH.
ARG BASE_IMAGE=localhost/envpipe-e2e/debian:bookworm
FROM ${BASE_IMAGE}
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /usr/local/python
ENV PATH=/usr/local/python/bin:$PATH
