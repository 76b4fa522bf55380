// Command bench-cr is the bench's BaseTenant controller on controller-runtime, written as a
// controller-runtime user would with its defaults: a manager whose cache watches only this
// run's BaseTenants and the children labelled with its manager, one controller (`For` the
// BaseTenant, `Owns` the four child kinds, the priority queue, 16 workers) whose every
// reconcile applies every child and the status with server-side apply (forced).
//
// It prints the lines `cargo xtask bench` reads on stdout: `reconcile <unix ms> <name>
// <tenant>` per reconcile and `synced` once the caches are synced.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

const (
	// runLabel is on every BaseTenant of one bench run.
	runLabel = "bench.idem.dev/run"
	// managedByLabel names the manager of a child; the cache watches children by it.
	managedByLabel = "app.kubernetes.io/managed-by"
	// fieldManager is this controller's field manager and managed-by value.
	fieldManager = "cr-bench"
	// childName names the quota, LimitRange and RoleBinding in each namespace.
	childName = "base"
)

var groupVersion = schema.GroupVersion{Group: "bench.idem.dev", Version: "v1alpha1"}

// BaseTenantSpec is the desired state of a bench tenant.
type BaseTenantSpec struct {
	Tenant     string   `json:"tenant"`
	Namespaces []string `json:"namespaces"`
	CPU        string   `json:"cpu"`
	Owner      string   `json:"owner"`
}

// BaseTenantStatus is the observed state of a bench tenant.
type BaseTenantStatus struct {
	ObservedGeneration *int64             `json:"observedGeneration,omitempty"`
	Conditions         []metav1.Condition `json:"conditions,omitempty"`
}

// BaseTenant is the bench's cluster-scoped primary.
type BaseTenant struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              BaseTenantSpec   `json:"spec"`
	Status            BaseTenantStatus `json:"status,omitempty"`
}

// BaseTenantList is a list of BaseTenants.
type BaseTenantList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BaseTenant `json:"items"`
}

// DeepCopyObject copies the object (what controller-gen would generate).
func (in *BaseTenant) DeepCopyObject() runtime.Object {
	out := new(BaseTenant)
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Spec = in.Spec
	out.Spec.Namespaces = append([]string(nil), in.Spec.Namespaces...)
	if in.Status.ObservedGeneration != nil {
		out.Status.ObservedGeneration = ptr.To(*in.Status.ObservedGeneration)
	}
	for i := range in.Status.Conditions {
		var c metav1.Condition
		in.Status.Conditions[i].DeepCopyInto(&c)
		out.Status.Conditions = append(out.Status.Conditions, c)
	}
	return out
}

// DeepCopyObject copies the list.
func (in *BaseTenantList) DeepCopyObject() runtime.Object {
	out := new(BaseTenantList)
	out.TypeMeta = in.TypeMeta
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	for i := range in.Items {
		out.Items = append(out.Items, *in.Items[i].DeepCopyObject().(*BaseTenant))
	}
	return out
}

// stdout serialises the reported lines, so concurrent reconciles never interleave.
var stdout sync.Mutex

func report(line string) {
	stdout.Lock()
	defer stdout.Unlock()
	_, _ = os.Stdout.WriteString(line + "\n")
}

type reconciler struct {
	client client.Client
	resync time.Duration
}

func (r *reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var bt BaseTenant
	if err := r.client.Get(ctx, req.NamespacedName, &bt); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	report(fmt.Sprintf("reconcile %d %s %s", time.Now().UnixMilli(), bt.Name, bt.Spec.Tenant))
	owner := metav1ac.OwnerReference().
		WithAPIVersion(groupVersion.String()).
		WithKind("BaseTenant").
		WithName(bt.Name).
		WithUID(bt.UID).
		WithController(true).
		WithBlockOwnerDeletion(true)
	own := map[string]string{managedByLabel: fieldManager}
	opts := []client.ApplyOption{client.FieldOwner(fieldManager), client.ForceOwnership}
	for _, short := range bt.Spec.Namespaces {
		ns := bt.Name + "-" + short
		if err := r.client.Apply(ctx, corev1ac.Namespace(ns).
			WithLabels(own).WithOwnerReferences(owner), opts...); err != nil {
			return ctrl.Result{}, err
		}
	}
	for _, short := range bt.Spec.Namespaces {
		ns := bt.Name + "-" + short
		cpu, err := resource.ParseQuantity(bt.Spec.CPU)
		if err != nil {
			return ctrl.Result{}, err
		}
		quota := corev1ac.ResourceQuota(childName, ns).
			WithLabels(own).WithOwnerReferences(owner).
			WithSpec(corev1ac.ResourceQuotaSpec().WithHard(corev1.ResourceList{
				corev1.ResourceLimitsCPU: cpu,
				corev1.ResourcePods:      resource.MustParse("20"),
			}))
		limits := corev1ac.LimitRange(childName, ns).
			WithLabels(own).WithOwnerReferences(owner).
			WithSpec(corev1ac.LimitRangeSpec().WithLimits(corev1ac.LimitRangeItem().
				WithType(corev1.LimitTypeContainer).
				WithDefault(corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m")}).
				WithDefaultRequest(corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")})))
		binding := rbacv1ac.RoleBinding(childName, ns).
			WithLabels(own).WithOwnerReferences(owner).
			WithRoleRef(rbacv1ac.RoleRef().
				WithAPIGroup(rbacv1.GroupName).WithKind("ClusterRole").WithName("admin")).
			WithSubjects(rbacv1ac.Subject().
				WithKind(rbacv1.UserKind).WithName(bt.Spec.Owner).WithAPIGroup(rbacv1.GroupName))
		for _, obj := range []runtime.ApplyConfiguration{quota, limits, binding} {
			if err := r.client.Apply(ctx, obj, opts...); err != nil {
				return ctrl.Result{}, err
			}
		}
	}
	// SetStatusCondition keeps the transition time of an unchanged condition.
	conditions := append([]metav1.Condition(nil), bt.Status.Conditions...)
	meta.SetStatusCondition(&conditions, metav1.Condition{
		Type:               "Ready",
		Status:             metav1.ConditionTrue,
		Reason:             "Reconciled",
		Message:            fmt.Sprintf("%d children applied", len(bt.Spec.Namespaces)*4),
		ObservedGeneration: bt.Generation,
	})
	status, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&BaseTenantStatus{
		ObservedGeneration: ptr.To(bt.Generation),
		Conditions:         conditions,
	})
	if err != nil {
		return ctrl.Result{}, err
	}
	body := &unstructured.Unstructured{Object: map[string]any{"status": status}}
	body.SetGroupVersionKind(groupVersion.WithKind("BaseTenant"))
	body.SetName(bt.Name)
	if err := r.client.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(body),
		client.FieldOwner(fieldManager), client.ForceOwnership); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: r.resync}, nil
}

func main() {
	// --kubeconfig is controller-runtime's own flag (pkg/client/config), read by GetConfig.
	run := flag.String("run", "", "reconcile only BaseTenants labelled bench.idem.dev/run=<run>")
	workers := flag.Int("workers", 16, "concurrent reconciles")
	resyncSecs := flag.Int("resync-secs", 0, "reconcile every converged object again after this many seconds (0: never)")
	flag.Parse()
	ctrl.SetLogger(zap.New())
	if err := start(*run, *workers, time.Duration(*resyncSecs)*time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "bench-cr:", err)
		os.Exit(1)
	}
}

func start(run string, workers int, resync time.Duration) error {
	config, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	scheme.AddKnownTypes(groupVersion, &BaseTenant{}, &BaseTenantList{})
	metav1.AddToGroupVersion(scheme, groupVersion)

	children := cache.ByObject{Label: labels.SelectorFromSet(labels.Set{managedByLabel: fieldManager})}
	kinds := []client.Object{&corev1.Namespace{}, &corev1.ResourceQuota{}, &corev1.LimitRange{}, &rbacv1.RoleBinding{}}
	byObject := map[client.Object]cache.ByObject{
		&BaseTenant{}: {Label: labels.SelectorFromSet(labels.Set{runLabel: run})},
	}
	for _, k := range kinds {
		byObject[k] = children
	}
	mgr, err := ctrl.NewManager(config, ctrl.Options{
		Scheme:  scheme,
		Cache:   cache.Options{ByObject: byObject},
		Metrics: metricsserver.Options{BindAddress: "0"},
	})
	if err != nil {
		return err
	}
	b := ctrl.NewControllerManagedBy(mgr).
		For(&BaseTenant{}).
		WithOptions(controller.Options{
			MaxConcurrentReconciles: workers,
			UsePriorityQueue:        ptr.To(true),
		})
	for _, k := range kinds {
		b = b.Owns(k)
	}
	if err := b.Complete(&reconciler{client: mgr.GetClient(), resync: resync}); err != nil {
		return err
	}
	// Started once the manager's cache runs; GetInformer blocks until that kind is synced.
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		for _, k := range append([]client.Object{&BaseTenant{}}, kinds...) {
			if _, err := mgr.GetCache().GetInformer(ctx, k); err != nil {
				return err
			}
		}
		report("synced")
		return nil
	})); err != nil {
		return err
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}
