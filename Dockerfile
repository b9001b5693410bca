# syntax=docker/dockerfile:1
# kshard's image: the kshard controller, the custom metrics adapter
# kshard-metrics-adapter (deploy/metrics-adapter) and the stand-in
# configcenter, static binaries on distroless (no shell, no package manager),
# running as the non-root user 65532. Build with `make image`.

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETOS=linux
ARG TARGETARCH=amd64
WORKDIR /src
# go.work names modules the build context leaves out (deploy/, .dockerignore):
# each module is built on its own, the adapter's with its replace of the main
# module.
ENV GOWORK=off
# Dependencies first: this layer is reused until a go.mod or go.sum changes.
COPY go.mod go.sum ./
COPY cmd/kshard-metrics-adapter/go.mod cmd/kshard-metrics-adapter/go.sum ./cmd/kshard-metrics-adapter/
RUN --mount=type=cache,target=/go/pkg/mod go mod download && cd cmd/kshard-metrics-adapter && go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/kshard ./cmd/configcenter && \
    cd cmd/kshard-metrics-adapter && go build -trimpath -ldflags="-s -w" -o /out/ .

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/kshard /out/kshard-metrics-adapter /out/configcenter /
USER 65532:65532
ENTRYPOINT ["/kshard"]
