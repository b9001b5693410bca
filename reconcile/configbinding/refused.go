package configbinding

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// maxConfigMapBytes is the most the API server accepts in one ConfigMap:
// its data and binaryData values together (the key names do not count).
const maxConfigMapBytes = corev1.MaxSecretSize

// tooLarge returns the TargetTooLarge condition when data cannot fit in a
// ConfigMap, so that nothing is written: the API server would refuse the
// apply on every reconcile. It counts as the API server's validation does,
// the values' bytes; a value is counted as it arrives in a JSON request,
// where each byte that is not valid UTF-8 becomes U+FFFD (three bytes), so
// the count is never below the API server's.
func tooLarge(name string, data map[string]string) *metav1.Condition {
	sizes := make(map[string]int, len(data))
	total := 0
	for k, v := range data {
		sizes[k] = encodedSize(v)
		total += sizes[k]
	}
	if total <= maxConfigMapBytes {
		return nil
	}
	largest := slices.SortedFunc(maps.Keys(sizes), func(a, b string) int {
		return cmp.Or(cmp.Compare(sizes[b], sizes[a]), strings.Compare(a, b))
	})
	var named []string
	for _, k := range largest[:min(3, len(largest))] {
		named = append(named, fmt.Sprintf("%s %d", k, sizes[k]))
	}
	return &metav1.Condition{Type: ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonTargetTooLarge,
		Message: fmt.Sprintf("the bound keys' values are %d bytes (largest: %s), above the %d bytes the API server accepts in a ConfigMap: "+
			"nothing was written and ConfigMap %s keeps its last values; bind fewer or smaller keys, or split them over two bindings",
			total, strings.Join(named, ", "), maxConfigMapBytes, name)}
}

// encodedSize is the bytes a string value takes once it has crossed a JSON
// request: valid UTF-8 as it is, each invalid byte replaced by U+FFFD.
func encodedSize(v string) int {
	n := 0
	for i := 0; i < len(v); {
		r, w := utf8.DecodeRuneInString(v[i:])
		if r == utf8.RuneError && w == 1 {
			n += utf8.RuneLen(utf8.RuneError)
		} else {
			n += w
		}
		i += w
	}
	return n
}

// refusedApply names an apply of the target ConfigMap that the API server
// refused for a reason no retry fixes: the binding says so (Ready=False, a
// reason, the API server's message) and looks again every RetryAfter and on
// its next change, instead of failing every reconcile with backoff, no word,
// and a Ready that still describes the ConfigMap's last values. It returns
// nil for errors that may pass on a retry (timeouts, 5xx, throttling).
func refusedApply(name string, err error) *metav1.Condition {
	c := &metav1.Condition{Type: ConditionReady, Status: metav1.ConditionFalse}
	msg := apiMessage(err)
	switch {
	case apierrors.IsForbidden(err):
		c.Reason = ReasonTargetForbidden
		c.Message = fmt.Sprintf("writing ConfigMap %s was refused: %s", name, msg)
	case apierrors.IsRequestEntityTooLargeError(err):
		// The request or the stored object is above the API server's or
		// etcd's limit.
		c.Reason = ReasonTargetTooLarge
		c.Message = fmt.Sprintf("ConfigMap %s is larger than the API server accepts: %s; it keeps its last values: bind fewer or smaller keys", name, msg)
	case apierrors.IsInvalid(err):
		immutable, tooLong, clashing := invalidCauses(err)
		switch {
		case immutable:
			c.Reason = ReasonTargetImmutable
			c.Message = fmt.Sprintf("ConfigMap %s is immutable, so its data cannot change: %s; it keeps its last values: delete it and the binding writes it again", name, msg)
		case tooLong:
			c.Reason = ReasonTargetTooLarge
			c.Message = fmt.Sprintf("ConfigMap %s would be larger than the API server accepts (binaryData counts too): %s; it keeps its last values: bind fewer or smaller keys, or remove its binaryData", name, msg)
		case len(clashing) > 0:
			c.Reason = ReasonTargetKeyConflict
			c.Message = fmt.Sprintf("ConfigMap %s has binaryData keys this binding writes as data (%s): %s; remove them from binaryData", name, strings.Join(clashing, ", "), msg)
		default:
			c.Reason = ReasonTargetInvalid
			c.Message = fmt.Sprintf("the API server refused ConfigMap %s: %s", name, msg)
		}
	default:
		return nil
	}
	return c
}

// invalidCauses reads an Invalid answer's causes as ConfigMap validation
// reports them: a data or binaryData change of an immutable ConfigMap
// (Forbidden), values above the size limit (TooLong), and data keys that
// binaryData has too (Invalid on data[key], sorted).
func invalidCauses(err error) (immutable, tooLong bool, clashing []string) {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return false, false, nil
	}
	for _, cause := range status.Status().Details.Causes {
		switch {
		case cause.Type == metav1.CauseTypeForbidden && slices.Contains([]string{"immutable", "data", "binaryData"}, cause.Field):
			immutable = true
		case cause.Type == metav1.CauseTypeTooLong:
			tooLong = true
		case cause.Type == metav1.CauseTypeFieldValueInvalid && strings.Contains(cause.Message, "binaryData"):
			if k, ok := strings.CutPrefix(cause.Field, "data["); ok {
				clashing = append(clashing, strings.TrimSuffix(k, "]"))
			}
		}
	}
	slices.Sort(clashing)
	return immutable, tooLong, clashing
}
