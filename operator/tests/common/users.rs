//! Acting as someone other than the admin: a tenant owner's impersonated client, and the user
//! data a test checks survives what idem does.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;

/// A client acting as user `user` (impersonated by the admin client), e.g. a tenant owner.
pub fn client_as(user: &str) -> kube::Client {
    let mut config = idem_tests::shared().config();
    config.auth_info.impersonate = Some(user.into());
    kube::Client::try_from(config).expect("an impersonating client")
}

/// A user's ConfigMap `data` in namespace `ns`: the user data that must survive.
pub async fn user_data(client: &kube::Client, ns: &str) {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "data"}, "data": {"k": "precious"}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
}

/// Panics unless the ConfigMap [`user_data`] made in `ns` is still there, unchanged.
pub async fn assert_user_data(client: &kube::Client, ns: &str) {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt("data")
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("the user's ConfigMap in {ns} was deleted"));
    assert_eq!(cm.data.unwrap_or_default()["k"], "precious");
}
