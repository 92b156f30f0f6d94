# Container images: `make image` builds runtime and clockd, `make push` pushes them,
# `make image push` does both. Overridable: REGISTRY, TAG, ENGINE (docker|podman), PLATFORM, and for
# builds without the upstream registries: RUNTIME_BASE_IMAGE / CLOCKD_BASE_IMAGE (the Dockerfiles'
# build-arg BASE_IMAGE; empty: their pinned CUDA / Python bases), TORCH_INDEX (the pip index of the
# torch wheel; empty: the CUDA 12.8 index) and BUILD_FLAGS (more flags for every build, e.g.
# BUILD_FLAGS='--format docker -v /srv/torch-index:/torchidx:ro').
ENGINE   ?= docker
REGISTRY ?=
TAG      ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
PLATFORM ?= linux/amd64
RUNTIME_BASE_IMAGE ?=
CLOCKD_BASE_IMAGE  ?=
TORCH_INDEX ?=
BUILD_FLAGS ?=
IMAGES   := runtime clockd
REVISION := $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
CREATED  := $(shell date -u +%Y-%m-%dT%H:%M:%SZ)

# Without a registry an image is tagged locally (envpipe-runtime:TAG); push needs REGISTRY.
image_ref = $(if $(REGISTRY),$(REGISTRY)/)envpipe-$(1):$(TAG)
build_args_runtime = $(if $(RUNTIME_BASE_IMAGE),--build-arg BASE_IMAGE=$(RUNTIME_BASE_IMAGE)) \
  $(if $(TORCH_INDEX),--build-arg TORCH_INDEX=$(TORCH_INDEX))
build_args_clockd = $(if $(CLOCKD_BASE_IMAGE),--build-arg BASE_IMAGE=$(CLOCKD_BASE_IMAGE))

# A reference the engine would refuse (after an hour of building, for `make image push`) is refused
# while the Makefile is read, in one line: only these characters, one word, a tag not led by '.' or '-'.
ref_chars := a b c d e f g h i j k l m n o p q r s t u v w x y z A B C D E F G H I J K L M N O P Q R S T U V W X Y Z \
  0 1 2 3 4 5 6 7 8 9 . _ -
strip_chars = $(if $(2),$(call strip_chars,$(subst $(firstword $(2)),,$(1)),$(wordlist 2,$(words $(2)),$(2))),$(1))
bad_ref = $(or $(filter-out 0 1,$(words $(1))),$(call strip_chars,$(1),$(ref_chars) $(2)))
ifneq ($(call bad_ref,$(REGISTRY),/ :),)
$(error REGISTRY='$(REGISTRY)' is not a registry: use host[:port][/path] of [A-Za-z0-9._-], e.g. ghcr.io/my-org)
endif
ifneq ($(or $(call bad_ref,$(TAG),),$(filter .% -%,$(TAG)),$(if $(TAG),,empty)),)
$(error TAG='$(TAG)' is not an image tag: use [A-Za-z0-9_.-], not starting with '.' or '-')
endif

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
	  $(build_args_$(img)) $(BUILD_FLAGS) -t $(call image_ref,$(img)) . &&) true

push: image-check-engine image-check-registry $(filter image,$(MAKECMDGOALS))
	$(foreach img,$(IMAGES),$(ENGINE) push $(call image_ref,$(img)) &&) true
