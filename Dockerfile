# syntax=docker/dockerfile:1
#
# paysvc container image.
#
#   docker build --build-arg VERSION="$(git describe --tags --always --dirty)" \
#                --build-arg REVISION="$(git rev-parse HEAD)" -t paysvc:dev .
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
RUN --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" \
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
# environment variables, or replace the file with a bind mount.
COPY config.yaml /etc/paysvc/config.yaml

USER nonroot:nonroot

# Admin HTTP server: GET /healthz (liveness) and GET /readyz (readiness).
EXPOSE 8080

# Distroless has no shell, curl or wget, so a HEALTHCHECK CMD cannot run in
# the container. The orchestrator probes the admin port instead:
#   Kubernetes: livenessProbe httpGet /healthz, readinessProbe httpGet /readyz
#               on port 8080;
#   Compose/Nomad/load balancers: HTTP GET /healthz and /readyz on port 8080.
HEALTHCHECK NONE

ENTRYPOINT ["/paysvc"]
CMD ["run", "--config", "/etc/paysvc/config.yaml"]
