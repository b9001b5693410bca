// Command image writes a single-layer container image made of static
// binaries, as a docker archive that `ctr images import` (and `docker load`)
// reads, with no container engine and no registry: the machines kshard is
// developed on have neither a Docker daemon nor access to a registry, so the
// image that `make cluster` runs is assembled here from files.
//
// The layer is like distroless/static: the given files, an /etc/passwd and
// /etc/group that name the root, nonroot (65532) and nobody users, and a
// world-writable /tmp. Every entry has a fixed owner and modification time so
// that the same binaries always give the same image digest.
//
//	go run ./hack/image -tag kshard:dev -o bin/images/kshard.tar \
//	  -user 65532:65532 -entrypoint /kshard -add /kshard=bin/image/kshard
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// epoch is every entry's modification time and the image's creation time:
// a fixed time keeps the digest a function of the files alone.
var epoch = time.Unix(0, 0).UTC()

// passwd and group are distroless/static's: user 65532 has a name and a home,
// so programs that look the user up find it.
const (
	passwd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group = "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"
)

// files collects repeated -add flags: DEST=SOURCE, DEST the absolute path in
// the image.
type files map[string]string

func (f files) String() string { return fmt.Sprint(map[string]string(f)) }

func (f files) Set(v string) error {
	dest, src, ok := strings.Cut(v, "=")
	if !ok || !strings.HasPrefix(dest, "/") || src == "" {
		return fmt.Errorf("want /DEST=SOURCE, got %q", v)
	}
	f[dest] = src
	return nil
}

func main() {
	add := files{}
	var (
		tag        = flag.String("tag", "", "the image's name and tag, as the archive records it (kshard:dev becomes docker.io/library/kshard:dev)")
		out        = flag.String("o", "", "the docker archive to write")
		user       = flag.String("user", "65532:65532", "the user and group the image runs as")
		entrypoint = flag.String("entrypoint", "", "the entrypoint, one path (arguments come from the pod)")
	)
	flag.Var(add, "add", "a file of the image, /DEST=SOURCE (repeatable); mode 0755, owner root")
	flag.Parse()
	if *tag == "" || *out == "" || len(add) == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*tag, *out, *user, *entrypoint, add); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(tag, out, user, entrypoint string, add files) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("parsing tag %q: %w", tag, err)
	}
	layerTar, err := layer(add)
	if err != nil {
		return err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return fmt.Errorf("hashing the layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		return fmt.Errorf("adding the layer: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("reading the empty image's config: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = "amd64", "linux"
	cfg.Created = v1.Time{Time: epoch}
	cfg.Config.User = user
	cfg.Config.WorkingDir = "/"
	cfg.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/home/nonroot"}
	if entrypoint != "" {
		cfg.Config.Entrypoint = []string{entrypoint}
	}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return fmt.Errorf("setting the config: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("creating the output folder: %w", err)
	}
	tmp := out + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		return errors.Join(fmt.Errorf("writing %s: %w", tmp, err), os.Remove(tmp))
	}
	if err := os.Rename(tmp, out); err != nil {
		return fmt.Errorf("renaming %s: %w", tmp, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("reading the image digest: %w", err)
	}
	fmt.Printf("wrote %s: %s %s\n", out, ref.Name(), digest)
	return nil
}

// layer returns the one layer's uncompressed tar: parent folders first, then
// the files in name order.
func layer(add files) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]int64{"/etc": 0o755, "/home": 0o755, "/tmp": 0o1777}
	for dest := range add {
		for d := filepath.Dir(dest); d != "/"; d = filepath.Dir(d) {
			if _, ok := dirs[d]; !ok {
				dirs[d] = 0o755
			}
		}
	}
	var names []string
	for d := range dirs {
		names = append(names, d)
	}
	sort.Strings(names)
	for _, d := range names {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: dirs[d], ModTime: epoch}); err != nil {
			return nil, fmt.Errorf("adding folder %s: %w", d, err)
		}
	}
	home := &tar.Header{Typeflag: tar.TypeDir, Name: "home/nonroot/", Mode: 0o700, Uid: 65532, Gid: 65532, ModTime: epoch}
	if err := tw.WriteHeader(home); err != nil {
		return nil, fmt.Errorf("adding /home/nonroot: %w", err)
	}
	for _, f := range []struct{ name, data string }{{"etc/group", group}, {"etc/passwd", passwd}} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o644, Size: int64(len(f.data)), ModTime: epoch}); err != nil {
			return nil, fmt.Errorf("adding /%s: %w", f.name, err)
		}
		if _, err := io.WriteString(tw, f.data); err != nil {
			return nil, fmt.Errorf("writing /%s: %w", f.name, err)
		}
	}
	names = names[:0]
	for dest := range add {
		names = append(names, dest)
	}
	sort.Strings(names)
	for _, dest := range names {
		data, err := os.ReadFile(add[dest])
		if err != nil {
			return nil, fmt.Errorf("reading the file for %s: %w", dest, err)
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(dest, "/"), Mode: 0o755, Size: int64(len(data)), ModTime: epoch}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("adding %s: %w", dest, err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, fmt.Errorf("writing %s: %w", dest, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("closing the layer: %w", err)
	}
	return buf.Bytes(), nil
}
