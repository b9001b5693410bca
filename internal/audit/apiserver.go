package audit

import (
	"bufio"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kshard/kshard/sharding"
)

// Policy is the API server audit policy (audit.k8s.io/v1) the write checks
// need: every write to Leases, ConfigMaps, ConfigBindings and
// ExternalDomains at RequestResponse level, so that each event carries the
// object as committed, with its resourceVersion. Pass it to kube-apiserver
// with --audit-policy-file and --audit-log-format=json.
//
//go:embed policy.yaml
var Policy []byte

// holderToken marks the holder identity in a replica's user agent.
const holderToken = " holder/"

// UserAgent is the user agent of a replica process: base (client-go's
// default, say) followed by the identity it holds Leases under. The API
// server records it in each audit event, so every write it committed names
// the process that made it, incarnation included, whichever credentials the
// process used.
func UserAgent(base, holder string) string { return base + holderToken + holder }

// HolderOf returns the holder identity a user agent names, if it is a
// replica's (UserAgent).
func HolderOf(userAgent string) (string, bool) {
	_, rest, ok := strings.Cut(userAgent, holderToken)
	if !ok {
		return "", false
	}
	holder, _, _ := strings.Cut(rest, " ")
	return holder, holder != ""
}

// PodNameExtra is the user extra the API server adds for a ServiceAccount
// token bound to a pod: the pod's name.
const PodNameExtra = "authentication.kubernetes.io/pod-name"

// event is the part of an audit.k8s.io/v1 Event the checks read.
type event struct {
	Stage      string `json:"stage"`
	RequestURI string `json:"requestURI"`
	Verb       string `json:"verb"`
	UserAgent  string `json:"userAgent"`
	User       struct {
		Username string              `json:"username"`
		Extra    map[string][]string `json:"extra"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code    int32  `json:"code"`
		Message string `json:"message"`
	} `json:"responseStatus"`
	ResponseObject *struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Name            string            `json:"name"`
			ResourceVersion string            `json:"resourceVersion"`
			Labels          map[string]string `json:"labels"`
		} `json:"metadata"`
		Spec struct {
			HolderIdentity *string           `json:"holderIdentity"`
			AcquireTime    *metav1.MicroTime `json:"acquireTime"`
		} `json:"spec"`
	} `json:"responseObject"`
	Received metav1.MicroTime `json:"requestReceivedTimestamp"`
	Done     metav1.MicroTime `json:"stageTimestamp"`
}

// Write is one write request the API server answered, as its audit log
// recorded it.
type Write struct {
	// Resource is the resource written, with its subresource:
	// "configmaps", "configbindings/status", "leases".
	Resource        string
	Namespace, Name string
	Verb            string
	// Username is the authenticated user; Pod the pod its ServiceAccount
	// token was bound to, if any.
	Username, Pod string
	// Holder is the holder identity the writer's user agent names, "" for a
	// writer that is not a replica (a person, the load tester, the garbage
	// collector).
	Holder string
	// Code is the response's HTTP status; Message its message on failure.
	Code    int32
	Message string
	// Version is the resourceVersion of the object the API server returned:
	// for a write that changed the object, the etcd revision of its commit,
	// which orders it against every other commit. 0 when the response
	// carried no object.
	Version uint64
	// Shard is the object's shard label as returned; -1 without one.
	Shard int32
	// LeaseHolder is, for a Lease, the holder identity it was written with,
	// and LeaseAcquired its acquire time: a new one marks an acquisition,
	// also by the holder it already named.
	LeaseHolder   string
	LeaseAcquired time.Time
	// Received and Done are the API server's own timestamps: when it
	// received the request and when it finished the response.
	Received, Done time.Time
}

func (w Write) committed() bool { return w.Code >= 200 && w.Code < 300 }

func (w Write) String() string {
	who := w.Holder
	if who == "" {
		who = w.Username
	}
	return fmt.Sprintf("%s %s %s/%s (shard %d) by %s at resourceVersion %d, received %s, answered %d",
		w.Verb, w.Resource, w.Namespace, w.Name, w.Shard, who, w.Version, w.Received.Format(time.StampMicro), w.Code)
}

// APILog is what an API server's audit log recorded of the writes the
// checks read.
type APILog struct {
	// Writes are the write requests it answered (stage ResponseComplete),
	// in the order of the log.
	Writes []Write
	// Syncs are the informers' initial syncs it served, in the order of
	// the log: what a relist costs the API server.
	Syncs []Sync
	// Events counts the audit events read, of every stage.
	Events int
}

// ReadAPILogFile reads the API server's JSON audit log at path, with the
// files it rotated out before it (kube-apiserver renames a full log
// <name>-<timestamp><ext>, by --audit-log-maxsize), oldest first: a check
// that read only the current file would miss the Lease commits before the
// rotation and see every later write as outside a tenure.
func ReadAPILogFile(path string) (*APILog, error) {
	ext := filepath.Ext(path)
	backups, err := filepath.Glob(strings.TrimSuffix(path, ext) + "-*" + ext)
	if err != nil {
		return nil, fmt.Errorf("reading audit log %s: %w", path, err)
	}
	sort.Strings(backups) // the timestamps sort as text
	var readers []io.Reader
	for _, name := range append(backups, path) {
		f, err := os.Open(name)
		if err != nil {
			return nil, fmt.Errorf("reading audit log: %w", err)
		}
		defer f.Close()
		readers = append(readers, f)
	}
	l, err := ReadAPILog(io.MultiReader(readers...))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return l, nil
}

// ReadAPILog reads an API server's JSON audit log (--audit-log-format=json):
// one event per line. Lines that are not audit events are an error: a log
// the checks cannot read must not pass as one without writes. A last line
// without its newline is one the API server is still writing, and is left
// for the next read.
func ReadAPILog(r io.Reader) (*APILog, error) {
	l := &APILog{}
	br := bufio.NewReaderSize(r, 256*1024)
	for line := 1; ; line++ {
		b, err := br.ReadBytes('\n')
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading audit log: %w", err)
		}
		if len(strings.TrimSpace(string(b))) == 0 {
			continue
		}
		var ev event
		if err := json.Unmarshal(b, &ev); err != nil {
			return nil, fmt.Errorf("audit log line %d: %w", line, err)
		}
		l.Events++
		if sy, ok := syncOf(&ev); ok {
			l.Syncs = append(l.Syncs, sy)
			continue
		}
		if ev.Stage != "ResponseComplete" || ev.ObjectRef == nil || ev.ResponseStatus == nil {
			continue
		}
		if strings.Contains(ev.RequestURI, "dryRun=") {
			// Admitted or refused, a dry run commits nothing.
			continue
		}
		switch ev.Verb {
		case "create", "update", "patch", "delete", "deletecollection":
		default:
			continue
		}
		w := Write{
			Resource:  ev.ObjectRef.Resource,
			Namespace: ev.ObjectRef.Namespace,
			Name:      ev.ObjectRef.Name,
			Verb:      ev.Verb,
			Username:  ev.User.Username,
			Code:      ev.ResponseStatus.Code,
			Message:   ev.ResponseStatus.Message,
			Shard:     -1,
			Received:  ev.Received.Time,
			Done:      ev.Done.Time,
		}
		if ev.ObjectRef.Subresource != "" {
			w.Resource += "/" + ev.ObjectRef.Subresource
		}
		if pods := ev.User.Extra[PodNameExtra]; len(pods) > 0 {
			w.Pod = pods[0]
		}
		w.Holder, _ = HolderOf(ev.UserAgent)
		if o := ev.ResponseObject; o != nil && o.Kind != "Status" {
			if w.Name == "" {
				w.Name = o.Metadata.Name
			}
			if v, err := strconv.ParseUint(o.Metadata.ResourceVersion, 10, 64); err == nil {
				w.Version = v
			}
			if s, ok := o.Metadata.Labels[sharding.LabelShard]; ok {
				if n, err := strconv.ParseInt(s, 10, 32); err == nil {
					w.Shard = int32(n)
				}
			}
			if o.Spec.HolderIdentity != nil {
				w.LeaseHolder = *o.Spec.HolderIdentity
			}
			if o.Spec.AcquireTime != nil {
				w.LeaseAcquired = o.Spec.AcquireTime.Time
			}
		}
		l.Writes = append(l.Writes, w)
	}
	return l, nil
}
