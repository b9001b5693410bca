package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
)

// The Ready condition and its reasons, as kshard's reconciler writes them:
// the load tester (and a person) reads both controllers' status alike.
const (
	conditionReady            = "Ready"
	reasonSynced              = "Synced"
	reasonKeyNotFound         = "KeyNotFound"
	reasonExternalUnavailable = "ExternalUnavailable"
)

// retryUnavailable is when a binding whose keys the config center failed to
// serve is reconciled again.
const retryUnavailable = 10 * time.Second

// reconciler makes each ConfigBinding's ConfigMap hold its keys' values,
// read from the config center on every reconcile.
type reconciler struct {
	client.Client
	center valueReader
}

// valueReader reads one key of a domain; an error wraps errKeyNotFound
// when the config center has no such key.
type valueReader interface {
	get(ctx context.Context, domain, key string) (centerValue, error)
}

// Reconcile reads every key synchronously, writes the ConfigMap when every
// key has a value (CreateOrUpdate: only when it differs), and updates status
// when it says something new. A failed write returns the error, and
// controller-runtime retries with backoff: so does a status update made on a
// cache copy older than the server's (a reconcile triggered by its own
// ConfigMap write before the status event arrived), which the API server
// answers 409 Conflict.
func (r *reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var cb configv1alpha1.ConfigBinding
	if err := r.Get(ctx, req.NamespacedName, &cb); err != nil {
		// Deleted: the owner reference deletes the ConfigMap.
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !cb.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	data := map[string]string{}
	var missing []string
	var revision int64
	var unavailable error
	for _, k := range cb.Spec.Keys {
		v, err := r.center.get(ctx, cb.Spec.Domain, string(k))
		switch {
		case errors.Is(err, errKeyNotFound):
			missing = append(missing, string(k))
		case err != nil && unavailable == nil:
			unavailable = err
		case err != nil:
		default:
			data[string(k)] = v.Value
			revision = max(revision, v.Revision)
		}
	}
	cond := readyCondition(missing, unavailable, revision)
	if cond.Reason == reasonSynced {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: cb.Namespace, Name: cb.Spec.Target.ConfigMapName}}
		if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, cm, func() error {
			cm.Data = data
			if cm.Labels == nil {
				cm.Labels = map[string]string{}
			}
			cm.Labels["app.kubernetes.io/managed-by"] = "plaincontroller"
			return controllerutil.SetControllerReference(&cb, cm, r.Scheme())
		}); err != nil {
			return ctrl.Result{}, fmt.Errorf("writing ConfigMap %s: %w", cm.Name, err)
		}
	}
	before := cb.Status.DeepCopy()
	cb.Status.ObservedGeneration = cb.Generation
	if cond.Reason == reasonSynced {
		cb.Status.ResolvedRevision = revision
	}
	cond.ObservedGeneration = cb.Generation
	meta.SetStatusCondition(&cb.Status.Conditions, cond)
	if !equality.Semantic.DeepEqual(before, &cb.Status) {
		if err := r.Status().Update(ctx, &cb); err != nil {
			return ctrl.Result{}, fmt.Errorf("updating status: %w", err)
		}
	}
	if cond.Reason == reasonExternalUnavailable {
		return ctrl.Result{RequeueAfter: retryUnavailable}, nil
	}
	return ctrl.Result{}, nil
}

// readyCondition is the Ready condition for what the config center
// answered, with kshard's reasons and messages: a missing key wins over an
// unavailable config center (a person must act), and the ConfigMap keeps its
// last values unless every key was read.
func readyCondition(missing []string, unavailable error, revision int64) metav1.Condition {
	c := metav1.Condition{Type: conditionReady, Status: metav1.ConditionFalse}
	switch {
	case len(missing) > 0:
		c.Reason = reasonKeyNotFound
		c.Message = fmt.Sprintf("keys not found in the config center: %s; the ConfigMap keeps its last values", strings.Join(missing, ", "))
	case unavailable != nil:
		c.Reason = reasonExternalUnavailable
		c.Message = fmt.Sprintf("config center unavailable (%v); the ConfigMap keeps its last values", unavailable)
	default:
		c.Status = metav1.ConditionTrue
		c.Reason = reasonSynced
		c.Message = fmt.Sprintf("the ConfigMap holds revision %d", revision)
	}
	return c
}

// errKeyNotFound: the config center has no such domain or key (404).
var errKeyNotFound = errors.New("key not found")

// callerHeader names the caller to the config center, which counts calls per
// caller (the load tester tells the replicas' calls from its own by it).
const callerHeader = "X-Kshard-Caller"

// centerValue is the config center's answer for one key.
type centerValue struct {
	Value    string `json:"value"`
	Revision int64  `json:"revision"`
}

// centerClient reads keys from the config center: GET
// /v1/domains/{domain}/keys/{key}, with a bearer token when one is set.
type centerClient struct {
	base, token, caller string
	http                *http.Client
}

func newCenterClient(base, token, caller string, timeout time.Duration, workers int) (*centerClient, error) {
	u, err := url.Parse(strings.TrimSuffix(base, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--configcenter-url %q must be http(s)://host[:port]", base)
	}
	return &centerClient{base: u.String(), token: token, caller: caller, http: newHTTPClient(timeout, workers)}, nil
}

// get reads one key; an error wraps errKeyNotFound on 404.
func (c *centerClient) get(ctx context.Context, domain, key string) (centerValue, error) {
	u := c.base + "/v1/domains/" + url.PathEscape(domain) + "/keys/" + url.PathEscape(key)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return centerValue{}, fmt.Errorf("getting %s/%s: %w", domain, key, err)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set(callerHeader, c.caller)
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return centerValue{}, fmt.Errorf("getting %s/%s: %w", domain, key, err)
	}
	defer func() {
		// Drain a little so the connection is reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return centerValue{}, fmt.Errorf("getting %s/%s: %w", domain, key, errKeyNotFound)
	case resp.StatusCode != http.StatusOK:
		return centerValue{}, fmt.Errorf("getting %s/%s: config center answered %s", domain, key, resp.Status)
	}
	var v centerValue
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&v); err != nil {
		return centerValue{}, fmt.Errorf("getting %s/%s: reading the answer: %w", domain, key, err)
	}
	return v, nil
}
