package k6_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/configcenter"
)

// kindCluster is what `make deploy` applies to kind (deploy/kind), as far as
// the scripts depend on it: the ConfigBinding CRD, the kshard StatefulSet
// that chaos.js deletes pods of, and what the config center seeds.
type kindCluster struct {
	crd                        *apiextensionsv1.CustomResourceDefinition
	statefulSet                *appsv1.StatefulSet
	seedDomains, keysPerDomain int
}

// deployedKind builds deploy/kind the way `kubectl apply -k` does.
func deployedKind(t *testing.T) kindCluster {
	t.Helper()
	kc, err := buildKind()
	if err != nil {
		t.Fatal(err)
	}
	return kc
}

// buildKind builds deploy/kind once for all tests.
var buildKind = sync.OnceValues(func() (kindCluster, error) {
	dir := filepath.Join("..", "..", "deploy", "kind")
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return kindCluster{}, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var kc kindCluster
	for _, r := range res.Resources() {
		b, err := r.AsYAML()
		if err != nil {
			return kindCluster{}, fmt.Errorf("kustomize build %s: %s: %w", dir, r.CurId(), err)
		}
		var into any
		switch {
		case r.GetKind() == "CustomResourceDefinition":
			var crd apiextensionsv1.CustomResourceDefinition
			if err := yaml.UnmarshalStrict(b, &crd); err != nil {
				return kindCluster{}, fmt.Errorf("%s: %w", r.CurId(), err)
			}
			if crd.Spec.Group == configv1alpha1.GroupVersion.Group && crd.Spec.Names.Kind == "ConfigBinding" {
				kc.crd = &crd
			}
			continue
		case r.GetKind() == "StatefulSet" && r.GetName() == "kshard":
			kc.statefulSet = &appsv1.StatefulSet{}
			into = kc.statefulSet
		case r.GetKind() == "Deployment" && r.GetName() == "configcenter":
			var d appsv1.Deployment
			if err := yaml.UnmarshalStrict(b, &d); err != nil {
				return kindCluster{}, fmt.Errorf("%s: %w", r.CurId(), err)
			}
			for _, c := range d.Spec.Template.Spec.Containers {
				if kc.seedDomains, err = intFlag(c.Args, "seed-domains", kc.seedDomains); err != nil {
					return kindCluster{}, err
				}
				if kc.keysPerDomain, err = intFlag(c.Args, "keys-per-domain", kc.keysPerDomain); err != nil {
					return kindCluster{}, err
				}
			}
			continue
		default:
			continue
		}
		if err := yaml.UnmarshalStrict(b, into); err != nil {
			return kindCluster{}, fmt.Errorf("%s: %w", r.CurId(), err)
		}
	}
	if kc.crd == nil || kc.statefulSet == nil || kc.seedDomains == 0 || kc.keysPerDomain == 0 {
		return kindCluster{}, fmt.Errorf("%s lacks the ConfigBinding CRD, StatefulSet kshard or a configcenter Deployment that seeds domains and keys", dir)
	}
	return kc, nil
})

// intFlag reads --name=N or --name N from a container's args.
func intFlag(args []string, name string, def int) (int, error) {
	for i, a := range args {
		var raw string
		switch {
		case strings.HasPrefix(a, "--"+name+"="):
			raw = strings.TrimPrefix(a, "--"+name+"=")
		case a == "--"+name && i+1 < len(args):
			raw = args[i+1]
		default:
			continue
		}
		n, err := strconv.Atoi(raw)
		if err != nil {
			return 0, fmt.Errorf("configcenter --%s %q: %w", name, raw, err)
		}
		return n, nil
	}
	return def, nil
}

// fakeAPI is just enough of the Kubernetes API for the scripts, at the
// paths of api/v1alpha1 and the CRD's plural: it validates what the scripts
// write as the real API server and kshard would (a binding to a domain or
// key the config center does not seed never becomes Ready), and plays the
// controller by marking a generation Ready after a few reads.
type fakeAPI struct {
	t      *testing.T
	server *httptest.Server

	// What the cluster holds: the config center's seeded names, and the
	// kshard StatefulSet's replicas.
	domains, keysPerDomain int
	replicas               int
	controllerNamespace    string
	statefulSet            string
	// readyAfterGets is how many reads of a new generation it takes until
	// the "controller" has made it Ready; -1 never.
	readyAfterGets int
	// serveCRD false answers 404 to discovery, as a cluster without the CRD.
	serveCRD bool

	group, version, plural, kind string

	mu          sync.Mutex
	namespaces  map[string]bool
	objects     map[string]*storedBinding // namespace/name
	created     int
	updates     int
	readySeen   int // generations a script read as Ready
	podsDeleted []string
}

type storedBinding struct {
	obj       configv1alpha1.ConfigBinding
	gets      int  // reads since the spec last changed
	readySeen bool // a read returned the current generation Ready
}

// newFakeAPI serves the cluster of deploy/kind, with a config center that
// seeds domains × keysPerDomain.
func newFakeAPI(t *testing.T, domains, keysPerDomain int) *fakeAPI {
	kc := deployedKind(t)
	crd := kc.crd
	f := &fakeAPI{
		t:                   t,
		domains:             domains,
		keysPerDomain:       keysPerDomain,
		replicas:            int(ptr.Deref(kc.statefulSet.Spec.Replicas, 1)),
		controllerNamespace: kc.statefulSet.Namespace,
		statefulSet:         kc.statefulSet.Name,
		readyAfterGets:      3,
		serveCRD:            true,
		group:               configv1alpha1.GroupVersion.Group,
		version:             configv1alpha1.GroupVersion.Version,
		plural:              crd.Spec.Names.Plural,
		kind:                crd.Spec.Names.Kind,
		namespaces:          map[string]bool{"default": true, kc.statefulSet.Namespace: true},
		objects:             map[string]*storedBinding{},
	}
	served := false
	for _, v := range crd.Spec.Versions {
		served = served || (v.Name == f.version && v.Served)
	}
	if !served {
		t.Fatalf("the CRD does not serve %s", configv1alpha1.GroupVersion)
	}
	f.server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.server.Close)
	return f
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeStatus(w http.ResponseWriter, code int, format string, args ...any) {
	writeJSON(w, code, metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Code: int32(code), Message: fmt.Sprintf(format, args...),
	})
}

// unexpected answers a request the scripts should never make, and fails the
// test: a wrong group, version, plural or namespace lands here.
func (f *fakeAPI) unexpected(w http.ResponseWriter, r *http.Request) {
	f.t.Errorf("the script sent %s %s, which no ConfigBinding workload needs", r.Method, r.URL)
	writeStatus(w, http.StatusNotFound, "the server could not find the requested resource")
}

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	path := strings.Trim(r.URL.Path, "/")
	seg := strings.Split(path, "/")
	cbPrefix := "apis/" + f.group + "/" + f.version
	switch {
	case path == cbPrefix && r.Method == http.MethodGet:
		if !f.serveCRD {
			writeStatus(w, http.StatusNotFound, "the server could not find the requested resource")
			return
		}
		writeJSON(w, http.StatusOK, metav1.APIResourceList{
			TypeMeta:     metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
			GroupVersion: configv1alpha1.GroupVersion.String(),
			APIResources: []metav1.APIResource{{Name: f.plural, Namespaced: true, Kind: f.kind,
				Verbs: metav1.Verbs{"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}}},
		})
	case strings.HasPrefix(path, cbPrefix+"/namespaces/") && len(seg) >= 6 && seg[5] == f.plural && f.serveCRD:
		ns := seg[4]
		if !f.namespaces[ns] {
			writeStatus(w, http.StatusNotFound, "namespaces %q not found", ns)
			return
		}
		switch {
		case len(seg) == 6:
			f.serveCollection(w, r, ns)
		case len(seg) == 7:
			f.serveBinding(w, r, ns, seg[6])
		default:
			f.unexpected(w, r)
		}
	case path == "apis/apps/v1/namespaces/"+f.controllerNamespace+"/statefulsets/"+f.statefulSet && r.Method == http.MethodGet:
		if f.replicas < 0 {
			writeStatus(w, http.StatusNotFound, "statefulsets.apps %q not found", f.statefulSet)
			return
		}
		writeJSON(w, http.StatusOK, appsv1.StatefulSet{
			TypeMeta:   metav1.TypeMeta{Kind: "StatefulSet", APIVersion: "apps/v1"},
			ObjectMeta: metav1.ObjectMeta{Name: f.statefulSet, Namespace: f.controllerNamespace},
			Spec:       appsv1.StatefulSetSpec{Replicas: ptr.To(int32(f.replicas))},
			Status:     appsv1.StatefulSetStatus{Replicas: int32(f.replicas), ReadyReplicas: int32(f.replicas)},
		})
	case strings.HasPrefix(path, "api/v1/namespaces/"+f.controllerNamespace+"/pods/") && len(seg) == 6 && r.Method == http.MethodDelete:
		f.deletePod(w, r, seg[5])
	case path == "api/v1/namespaces" && r.Method == http.MethodPost:
		var ns corev1.Namespace
		if !decodeStrict(w, r, "application/json", &ns) {
			return
		}
		if f.namespaces[ns.Name] {
			writeStatus(w, http.StatusConflict, "namespaces %q already exists", ns.Name)
			return
		}
		f.namespaces[ns.Name] = true
		writeJSON(w, http.StatusCreated, ns)
	case strings.HasPrefix(path, "api/v1/namespaces/") && len(seg) == 4 && (r.Method == http.MethodGet || r.Method == http.MethodDelete):
		if !f.namespaces[seg[3]] {
			writeStatus(w, http.StatusNotFound, "namespaces %q not found", seg[3])
			return
		}
		if r.Method == http.MethodDelete {
			delete(f.namespaces, seg[3])
			for k := range f.objects {
				if strings.HasPrefix(k, seg[3]+"/") {
					delete(f.objects, k)
				}
			}
		}
		writeJSON(w, http.StatusOK, corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: seg[3]}})
	default:
		f.unexpected(w, r)
	}
}

func (f *fakeAPI) deletePod(w http.ResponseWriter, r *http.Request, name string) {
	n, err := strconv.Atoi(strings.TrimPrefix(name, f.statefulSet+"-"))
	if !strings.HasPrefix(name, f.statefulSet+"-") || err != nil || n < 0 || n >= f.replicas {
		f.t.Errorf("the script deleted pod %s, which is not a pod of StatefulSet %s with %d replicas", name, f.statefulSet, f.replicas)
		writeStatus(w, http.StatusNotFound, "pods %q not found", name)
		return
	}
	grace := "default"
	if r.ContentLength > 0 {
		var opts metav1.DeleteOptions
		if !decodeStrict(w, r, "application/json", &opts) {
			return
		}
		if opts.GracePeriodSeconds != nil {
			grace = strconv.FormatInt(*opts.GracePeriodSeconds, 10)
		}
	}
	f.podsDeleted = append(f.podsDeleted, name+" grace="+grace)
	writeJSON(w, http.StatusOK, corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.controllerNamespace}})
}

// decodeStrict decodes a request body as the API server would, refusing
// fields the type does not have.
func decodeStrict(w http.ResponseWriter, r *http.Request, contentType string, into any) bool {
	if got := r.Header.Get("Content-Type"); got != contentType {
		writeStatus(w, http.StatusUnsupportedMediaType, "%s %s: Content-Type %q, want %q", r.Method, r.URL.Path, got, contentType)
		return false
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		writeStatus(w, http.StatusBadRequest, "%s %s: %v", r.Method, r.URL.Path, err)
		return false
	}
	return true
}

func (f *fakeAPI) selected(w http.ResponseWriter, r *http.Request, ns string) ([]string, bool) {
	sel, err := labels.Parse(r.URL.Query().Get("labelSelector"))
	if err != nil {
		writeStatus(w, http.StatusBadRequest, "labelSelector: %v", err)
		return nil, false
	}
	var keys []string
	for k, o := range f.objects {
		if o.obj.Namespace == ns && sel.Matches(labels.Set(o.obj.Labels)) {
			keys = append(keys, k)
		}
	}
	return keys, true
}

func (f *fakeAPI) serveCollection(w http.ResponseWriter, r *http.Request, ns string) {
	switch r.Method {
	case http.MethodPost:
		var cb configv1alpha1.ConfigBinding
		if !decodeStrict(w, r, "application/json", &cb) {
			return
		}
		if cb.Namespace != "" && cb.Namespace != ns {
			writeStatus(w, http.StatusBadRequest, "the namespace of the object (%s) does not match the namespace on the request (%s)", cb.Namespace, ns)
			return
		}
		cb.Namespace = ns
		if err := f.validate(&cb); err != nil {
			writeStatus(w, http.StatusUnprocessableEntity, "ConfigBinding %q is invalid: %v", cb.Name, err)
			return
		}
		if _, ok := f.objects[ns+"/"+cb.Name]; ok {
			writeStatus(w, http.StatusConflict, "configbindings %q already exists", cb.Name)
			return
		}
		cb.Generation = 1
		cb.Status = configv1alpha1.ConfigBindingStatus{}
		f.objects[ns+"/"+cb.Name] = &storedBinding{obj: cb}
		f.created++
		writeJSON(w, http.StatusCreated, cb)
	case http.MethodGet, http.MethodDelete:
		keys, ok := f.selected(w, r, ns)
		if !ok {
			return
		}
		list := configv1alpha1.ConfigBindingList{TypeMeta: metav1.TypeMeta{Kind: "ConfigBindingList", APIVersion: configv1alpha1.GroupVersion.String()}}
		for _, k := range keys {
			list.Items = append(list.Items, f.objects[k].obj)
			if r.Method == http.MethodDelete {
				delete(f.objects, k)
			}
		}
		if r.Method == http.MethodGet && r.URL.Query().Get("limit") != "" {
			limit, err := strconv.Atoi(r.URL.Query().Get("limit"))
			if err != nil || limit < 0 {
				writeStatus(w, http.StatusBadRequest, "limit %q", r.URL.Query().Get("limit"))
				return
			}
			if limit > 0 && len(list.Items) > limit {
				list.Items = list.Items[:limit]
			}
		}
		if list.Items == nil {
			list.Items = []configv1alpha1.ConfigBinding{}
		}
		writeJSON(w, http.StatusOK, list)
	default:
		f.unexpected(w, r)
	}
}

func (f *fakeAPI) serveBinding(w http.ResponseWriter, r *http.Request, ns, name string) {
	st, ok := f.objects[ns+"/"+name]
	if !ok {
		writeStatus(w, http.StatusNotFound, "configbindings.%s %q not found", f.group, name)
		return
	}
	switch r.Method {
	case http.MethodGet:
		// Like the controller, the status lags the spec: the first read
		// after a change still shows the previous generation's status (Ready,
		// after an update). The new generation is Ready after readyAfterGets
		// reads, or, with readyAfterGets -1, observed but Fetching forever.
		st.gets++
		if st.gets >= 2 || (f.readyAfterGets >= 0 && st.gets >= f.readyAfterGets) {
			ready := metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: "Fetching", ObservedGeneration: st.obj.Generation}
			if f.readyAfterGets >= 0 && st.gets >= f.readyAfterGets {
				ready.Status, ready.Reason = metav1.ConditionTrue, "Synced"
			}
			st.obj.Status.ObservedGeneration = st.obj.Generation
			meta.SetStatusCondition(&st.obj.Status.Conditions, ready)
			if ready.Status == metav1.ConditionTrue && !st.readySeen {
				st.readySeen = true
				f.readySeen++
			}
		}
		writeJSON(w, http.StatusOK, st.obj)
	case http.MethodPatch:
		var patch map[string]any
		if !decodeStrict(w, r, "application/merge-patch+json", &patch) {
			return
		}
		merged, err := applyMergePatch(st.obj, patch)
		if err != nil {
			f.t.Errorf("patching %s: %v", name, err)
			writeStatus(w, http.StatusInternalServerError, "patching: %v", err)
			return
		}
		var cb configv1alpha1.ConfigBinding
		dec := json.NewDecoder(bytes.NewReader(merged))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cb); err != nil {
			writeStatus(w, http.StatusBadRequest, "patched object: %v", err)
			return
		}
		if err := f.validate(&cb); err != nil {
			writeStatus(w, http.StatusUnprocessableEntity, "ConfigBinding %q is invalid: %v", name, err)
			return
		}
		if cb.Spec.Domain != st.obj.Spec.Domain {
			writeStatus(w, http.StatusUnprocessableEntity, "spec.domain: Invalid value: domain is immutable")
			return
		}
		if !reflect.DeepEqual(cb.Spec, st.obj.Spec) {
			cb.Generation = st.obj.Generation + 1
			st.gets, st.readySeen = 0, false
			f.updates++
		}
		cb.Status = st.obj.Status
		st.obj = cb
		writeJSON(w, http.StatusOK, cb)
	default:
		f.unexpected(w, r)
	}
}

// applyMergePatch returns obj as JSON with patch applied.
func applyMergePatch(obj any, patch map[string]any) ([]byte, error) {
	orig, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var doc map[string]any
	if err := json.Unmarshal(orig, &doc); err != nil {
		return nil, err
	}
	return json.Marshal(mergePatch(doc, patch))
}

// mergePatch applies an RFC 7386 JSON merge patch.
func mergePatch(doc, patch map[string]any) map[string]any {
	for k, pv := range patch {
		if pv == nil {
			delete(doc, k)
			continue
		}
		pm, pIsMap := pv.(map[string]any)
		dm, dIsMap := doc[k].(map[string]any)
		if pIsMap && dIsMap {
			doc[k] = mergePatch(dm, pm)
		} else {
			doc[k] = pv
		}
	}
	return doc
}

// validate checks a binding as admission does (api/v1alpha1's markers) and
// as kshard would find it: its domain and keys must be ones the config
// center seeds, or the object could never become Ready.
func (f *fakeAPI) validate(cb *configv1alpha1.ConfigBinding) error {
	if cb.APIVersion != configv1alpha1.GroupVersion.String() || cb.Kind != f.kind {
		return fmt.Errorf("apiVersion %q kind %q, want %q %q", cb.APIVersion, cb.Kind, configv1alpha1.GroupVersion.String(), f.kind)
	}
	if errs := validation.IsDNS1123Subdomain(cb.Name); len(errs) > 0 {
		return fmt.Errorf("metadata.name %q: %s", cb.Name, strings.Join(errs, "; "))
	}
	for k, v := range cb.Labels {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return fmt.Errorf("label key %q: %s", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return fmt.Errorf("label %s value %q: %s", k, v, strings.Join(errs, "; "))
		}
	}
	if err := configcenter.ValidateDomain(cb.Spec.Domain); err != nil {
		return fmt.Errorf("spec.domain: %w", err)
	}
	if !f.seededDomain(cb.Spec.Domain) {
		return fmt.Errorf("spec.domain %q is not one of the %d domains the config center seeds (%s..%s)",
			cb.Spec.Domain, f.domains, configcenter.SeedDomain(0), configcenter.SeedDomain(f.domains-1))
	}
	if n := len(cb.Spec.Keys); n < 1 || n > 64 {
		return fmt.Errorf("spec.keys: %d keys, want 1 to 64", n)
	}
	seen := map[configv1alpha1.ConfigKey]bool{}
	for i, k := range cb.Spec.Keys {
		if err := configcenter.ValidateKey(string(k)); err != nil {
			return fmt.Errorf("spec.keys[%d]: %w", i, err)
		}
		if seen[k] {
			return fmt.Errorf("spec.keys[%d]: duplicate key %q", i, k)
		}
		seen[k] = true
		if !f.seededKey(string(k)) {
			return fmt.Errorf("spec.keys[%d] %q is not one of the %d keys the config center seeds per domain (%s..%s)",
				i, k, f.keysPerDomain, configcenter.SeedKey(0), configcenter.SeedKey(f.keysPerDomain-1))
		}
	}
	if errs := validation.IsDNS1123Subdomain(cb.Spec.Target.ConfigMapName); len(errs) > 0 {
		return fmt.Errorf("spec.target.configMapName %q: %s", cb.Spec.Target.ConfigMapName, strings.Join(errs, "; "))
	}
	return nil
}

func (f *fakeAPI) seededDomain(d string) bool {
	for i := range f.domains {
		if configcenter.SeedDomain(i) == d {
			return true
		}
	}
	return false
}

func (f *fakeAPI) seededKey(k string) bool {
	for j := range f.keysPerDomain {
		if configcenter.SeedKey(j) == k {
			return true
		}
	}
	return false
}

// state is what the fake holds and has seen, for assertions.
type state struct {
	objects    map[string]configv1alpha1.ConfigBinding
	namespaces map[string]bool
	created    int
	updates    int
	readySeen  int
	pods       []string
}

func (f *fakeAPI) snapshot() state {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := state{
		objects:    map[string]configv1alpha1.ConfigBinding{},
		namespaces: map[string]bool{},
		created:    f.created,
		updates:    f.updates,
		readySeen:  f.readySeen,
		pods:       append([]string(nil), f.podsDeleted...),
	}
	for k, v := range f.objects {
		s.objects[k] = v.obj
	}
	for k, v := range f.namespaces {
		s.namespaces[k] = v
	}
	return s
}
