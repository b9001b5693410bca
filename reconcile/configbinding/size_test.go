package configbinding

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestSizeCountsAsTheAPIServer: the size check counts a value as the API
// server receives it in a JSON request, never less: each byte that is not
// valid UTF-8 arrives as U+FFFD. A value set exactly at the limit passes,
// one byte more does not.
func TestSizeCountsAsTheAPIServer(t *testing.T) {
	for _, v := range []string{"", "plain", "ünïcödé ✓", "\xff\xfe bad", "a\x80b\xc3", strings.Repeat("<&>", 10)} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var decoded string
		if err := json.Unmarshal(b, &decoded); err != nil {
			t.Fatal(err)
		}
		if got, want := encodedSize(v), len(decoded); got < want {
			t.Errorf("encodedSize(%q) = %d, below the %d bytes the API server decodes", v, got, want)
		}
	}
	half := strings.Repeat("x", maxConfigMapBytes/2)
	if c := tooLarge("cm", map[string]string{"a": half, "b": half}); c != nil {
		t.Errorf("exactly the limit refused: %+v", c)
	}
	c := tooLarge("cm", map[string]string{"a": half, "b": half[1:] + "\xff"})
	if c == nil || c.Reason != ReasonTargetTooLarge || !strings.Contains(c.Message, "1048578 bytes") || !strings.Contains(c.Message, "ConfigMap cm") {
		t.Errorf("one invalid byte over the limit: %+v", c)
	}
}

// TestRefusalQuotesABoundedMessage: a refusal quotes the API server's
// message, cut to a size a condition holds (an admission webhook's answer
// is not bounded, and a condition message above 32 KiB would make every
// status patch fail).
func TestRefusalQuotesABoundedMessage(t *testing.T) {
	long := strings.Repeat("ä", 20<<10)
	err := apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "cm", errors.New(long))
	c := refusedApply("cm", err)
	if c == nil {
		t.Fatal("a 403 is not named")
	}
	if c.Reason != ReasonTargetForbidden || len(c.Message) > maxQuoted+200 || !utf8.ValidString(c.Message) || !strings.Contains(c.Message, "ää") {
		t.Fatalf("condition %d bytes, reason %v", len(c.Message), c.Reason)
	}
}
