# Container images: `make image` builds runtime and clockd, `make push` pushes them,
# `make image push` does both. Overridable: REGISTRY, TAG, ENGINE (docker|podman), PLATFORM.
ENGINE   ?= docker
REGISTRY ?=
TAG      ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
PLATFORM ?= linux/amd64
IMAGES   := runtime clockd
REVISION := $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
CREATED  := $(shell date -u +%Y-%m-%dT%H:%M:%SZ)

# Without a registry an image is tagged locally (envpipe-runtime:TAG); push needs REGISTRY.
image_ref = $(if $(REGISTRY),$(REGISTRY)/)envpipe-$(1):$(TAG)

# `make image push` must fail on a missing registry before spending an hour on builds.
IMAGE_CHECKS := image-check-engine $(if $(filter push,$(MAKECMDGOALS)),image-check-registry)

.PHONY: image push image-check-engine image-check-registry

image-check-engine:
	@case "$(notdir $(ENGINE))" in docker|podman) ;; \
	  *) echo "error: ENGINE='$(ENGINE)' is not supported; use ENGINE=docker or ENGINE=podman" >&2; exit 2;; esac
	@command -v $(ENGINE) >/dev/null 2>&1 || { \
	  echo "error: container engine '$(ENGINE)' not found on PATH; install it or set ENGINE=docker|podman" >&2; exit 2; }

image-check-registry:
	@test -n "$(REGISTRY)" || { \
	  echo "error: REGISTRY is not set; e.g. make push REGISTRY=ghcr.io/my-org" >&2; exit 2; }

image: $(IMAGE_CHECKS)
	$(foreach img,$(IMAGES),$(ENGINE) build --platform $(PLATFORM) -f images/$(img)/Dockerfile \
	  --build-arg VERSION=$(TAG) --build-arg REVISION=$(REVISION) --build-arg CREATED=$(CREATED) \
	  -t $(call image_ref,$(img)) . &&) true

push: image-check-engine image-check-registry $(filter image,$(MAKECMDGOALS))
	$(foreach img,$(IMAGES),$(ENGINE) push $(call image_ref,$(img)) &&) true
