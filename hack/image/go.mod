// Module image builds kshard's container images without a container engine
// (go-containerregistry writes the archive that `ctr images import` reads).
// It is a module of its own so that its dependencies never reach kshard's
// users through the main go.mod.
module github.com/kshard/kshard/hack/image

go 1.26.0

require github.com/google/go-containerregistry v0.22.1

require (
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
)
