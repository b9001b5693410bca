package configcenter

import (
	"errors"
	"fmt"
	"strings"
)

// MaxNameLength bounds domain and key names so that they fit a Kubernetes label value and a path
// segment, whatever the client.
const MaxNameLength = 63

const (
	keysPathPrefix = "/v1/domains/"
	keysPathInfix  = "/keys/"
)

// ErrInvalidName is wrapped by every name validation failure so that handlers can answer 400.
var ErrInvalidName = errors.New("invalid name")

// ValidateDomain reports whether s is usable as a domain: a DNS-1123 label, because a domain is
// also a shard key and a label value in kshard.
func ValidateDomain(s string) error {
	if err := checkLength("domain", s); err != nil {
		return err
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case isLowerAlnum(c):
		case c == '-' && i > 0 && i < len(s)-1:
		default:
			return fmt.Errorf("%w: domain %q must be a DNS-1123 label (lower case letters, digits and '-', starting and ending with a letter or digit)", ErrInvalidName, s)
		}
	}
	return nil
}

// ValidateKey reports whether s is usable as a key: a single safe path segment (lower case letters,
// digits, '.', '_' and '-', starting and ending with a letter or digit, no ".."), so that a key can
// never change the meaning of the URL it is placed in.
func ValidateKey(s string) error {
	if err := checkLength("key", s); err != nil {
		return err
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case isLowerAlnum(c):
		case (c == '.' || c == '_' || c == '-') && i > 0 && i < len(s)-1:
		default:
			return fmt.Errorf("%w: key %q must match ^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$", ErrInvalidName, s)
		}
	}
	if strings.Contains(s, "..") {
		return fmt.Errorf("%w: key %q must not contain \"..\"", ErrInvalidName, s)
	}
	return nil
}

func checkLength(what, s string) error {
	if s == "" {
		return fmt.Errorf("%w: %s must not be empty", ErrInvalidName, what)
	}
	if len(s) > MaxNameLength {
		return fmt.Errorf("%w: %s is %d bytes long, at most %d are allowed", ErrInvalidName, what, len(s), MaxNameLength)
	}
	return nil
}

func isLowerAlnum(c byte) bool {
	return ('a' <= c && c <= 'z') || ('0' <= c && c <= '9')
}

// KeyPath is the URL path of a key. Both names must be valid; the result needs no escaping.
func KeyPath(domain, key string) string {
	return keysPathPrefix + domain + keysPathInfix + key
}

// ParseKeyPath splits the escaped URL path of a key route into its domain and key, and validates
// both. The server uses it as the single source of truth for what a key path is, so that anything
// the router would have decoded (percent escapes, dot segments) is refused instead of interpreted.
func ParseKeyPath(escapedPath string) (domain, key string, err error) {
	rest, ok := strings.CutPrefix(escapedPath, keysPathPrefix)
	if !ok {
		return "", "", fmt.Errorf("%w: path must start with %q", ErrInvalidName, keysPathPrefix)
	}
	domain, key, ok = strings.Cut(rest, keysPathInfix)
	if !ok {
		return "", "", fmt.Errorf("%w: path must look like %s<domain>%s<key>", ErrInvalidName, keysPathPrefix, keysPathInfix)
	}
	if err := ValidateDomain(domain); err != nil {
		return "", "", err
	}
	if err := ValidateKey(key); err != nil {
		return "", "", err
	}
	return domain, key, nil
}
