package deploy_test

import (
	"context"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestPodSecurityRestricted creates pods from the StatefulSet's, the config
// centers' (etcd's and the stand-in's) and the metrics adapter's pod templates in the base's own
// namespace object (renamed), which enforces the restricted pod security
// profile: the API server's PodSecurity admission must admit them. Copies
// with one protection removed each must be rejected, so the check can fail.
// There is no controller manager here, so the test creates the pods the
// StatefulSet and the Deployments would.
func TestPodSecurityRestricted(t *testing.T) {
	ctx := context.Background()
	c := adminClient(t)
	ns := uniqueName("kshard-psa")
	objs := buildInNamespace(t, "kind", ns)
	namespace := byKind(objs, "Namespace")[0]
	if got := namespace.GetLabels()["pod-security.kubernetes.io/enforce"]; got != "restricted" {
		t.Fatalf("the base's namespace enforces %q, want restricted", got)
	}
	adapterObjs := buildInNamespace(t, "metrics-adapter", ns)
	accounts := append(byKind(objs, "ServiceAccount"), byKind(adapterObjs, "ServiceAccount")...)
	apply(ctx, t, c, append(byKind(objs, "Namespace"), accounts...))
	t.Cleanup(func() { remove(context.Background(), t, c, accounts) })

	var sts, etcd appsv1.StatefulSet
	fromUnstructured(t, byName(t, objs, "StatefulSet", "kshard"), &sts)
	fromUnstructured(t, byName(t, objs, "StatefulSet", "config-etcd"), &etcd)
	var standIn appsv1.Deployment
	fromUnstructured(t, byName(t, buildInNamespace(t, "configcenter", ns), "Deployment", "configcenter"), &standIn)
	var adapter appsv1.Deployment
	fromUnstructured(t, byKind(adapterObjs, "Deployment")[0], &adapter)
	templates := map[string]corev1.PodTemplateSpec{"kshard": sts.Spec.Template, "config-etcd": etcd.Spec.Template,
		"configcenter": standIn.Spec.Template, "kshard-metrics-adapter": adapter.Spec.Template}

	for name, tmpl := range templates {
		pod := podFrom(ns, name, tmpl)
		if err := c.Create(ctx, pod); err != nil {
			t.Errorf("the %s pod template is not admitted under the restricted profile: %v", name, err)
			continue
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), pod) })
	}

	breaks := map[string]func(*corev1.PodSpec){
		"privileged": func(s *corev1.PodSpec) {
			sc := s.Containers[0].SecurityContext
			sc.Privileged, sc.AllowPrivilegeEscalation = ptr.To(true), nil
		},
		"privilege escalation": func(s *corev1.PodSpec) { s.Containers[0].SecurityContext.AllowPrivilegeEscalation = nil },
		"capabilities kept":    func(s *corev1.PodSpec) { s.Containers[0].SecurityContext.Capabilities = nil },
		"root allowed":         func(s *corev1.PodSpec) { s.SecurityContext.RunAsNonRoot, s.SecurityContext.RunAsUser = nil, nil },
		"no seccomp profile":   func(s *corev1.PodSpec) { s.SecurityContext.SeccompProfile = nil },
		"host network":         func(s *corev1.PodSpec) { s.HostNetwork = true },
		"NET_RAW capability added": func(s *corev1.PodSpec) {
			s.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"NET_RAW"}
		},
		"hostPath volume":            func(s *corev1.PodSpec) { s.Volumes = append(s.Volumes, hostPathVolume()) },
		"unconfined seccomp profile": func(s *corev1.PodSpec) { s.SecurityContext.SeccompProfile.Type = corev1.SeccompProfileTypeUnconfined },
	}
	for name, tmpl := range templates {
		for what, breakIt := range breaks {
			broken := podFrom(ns, name+"-broken", *tmpl.DeepCopy())
			breakIt(&broken.Spec)
			err := c.Create(ctx, broken)
			if err == nil {
				_ = c.Delete(ctx, broken)
				t.Errorf("a %s pod with %s was admitted: the namespace does not enforce the restricted profile", name, what)
				continue
			}
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "violates PodSecurity") {
				t.Errorf("a %s pod with %s: got %v, want a PodSecurity rejection", name, what, err)
			}
		}
	}
}

func podFrom(namespace, name string, tmpl corev1.PodTemplateSpec) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name + "-0", Labels: tmpl.Labels, Annotations: tmpl.Annotations},
		Spec:       tmpl.Spec,
	}
}

func hostPathVolume() corev1.Volume {
	return corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}
}
