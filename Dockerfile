# syntax=docker/dockerfile:1
#
# paysvc container image.
#
#   make release        # a release: VERSION, its CHANGELOG.md entry, paysvc:X.Y.Z
#
# or by hand (what make release runs):
#
#   docker build --build-arg VERSION="$(cat VERSION)" \
#                --build-arg REVISION="$(git rev-parse HEAD)" -t paysvc:"$(cat VERSION)" .
#
# VERSION and REVISION become `paysvc version`, paysvc_build_info and the
# OCI labels org.opencontainers.image.version and .revision; without them
# the image says dev and unknown.
#
# Build arguments carry only version metadata: never pass secrets as ARG or
# ENV, they end up in the image history. Runtime credentials come from the
# environment or from files under /run/secrets (see deploy/compose.yaml).

ARG GO_VERSION=1.26

# ---------------------------------------------------------------- build --
FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src

# Dependencies first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download && go mod verify

COPY . .
ARG VERSION=dev
# The VCS revision: .git is not in the build context, so it comes in as an
# argument and is stamped into the binary (`paysvc version` prints it).
ARG REVISION=unknown
RUN --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.revision=${REVISION}" \
        -o /out/paysvc ./cmd/paysvc

# -------------------------------------------------------------- runtime --
# Static binary on distroless: no shell, no package manager, CA certificates
# and tzdata included, runs as uid/gid 65532 (nonroot).
FROM gcr.io/distroless/static-debian12:nonroot

ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="paysvc" \
      org.opencontainers.image.description="Payment message consumer (RabbitMQ -> MySQL/MariaDB, Redis)" \
      org.opencontainers.image.source="https://github.com/paysvc/paysvc" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="gcr.io/distroless/static-debian12:nonroot"

COPY --from=build /out/paysvc /paysvc
# Default configuration; every setting can be overridden by PAYSVC_*
# environment variables, or replace the file with a bind mount. Readable by
# uid 65532 whatever mode the checkout gave it (a umask of 077 makes it
# 0600, root's: every container would stop at start-up).
COPY --chmod=0444 config.yaml /etc/paysvc/config.yaml

# Numeric, so that Kubernetes' runAsNonRoot can verify it without reading
# /etc/passwd (65532 is distroless' nonroot).
USER 65532:65532

# Admin HTTP server: GET /healthz (liveness) and GET /readyz (readiness).
EXPOSE 8080

# Distroless has no shell, curl or wget: the binary checks itself
# (GET /healthz on http.addr, exit 0 or 1). Kubernetes ignores HEALTHCHECK
# and uses the probes in deploy/k8s.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/paysvc", "healthcheck", "--config", "/etc/paysvc/config.yaml"]

ENTRYPOINT ["/paysvc"]
CMD ["run", "--config", "/etc/paysvc/config.yaml"]
