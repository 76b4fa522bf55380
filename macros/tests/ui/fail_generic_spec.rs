use idem_runtime::IdempotentResource;

#[derive(IdempotentResource)]
#[kube(group = "tenancy.idem.dev", version = "v1alpha1", kind = "App", namespaced, status = "AppStatus")]
pub struct AppSpec<T> {
    pub value: T,
}

fn main() {}
