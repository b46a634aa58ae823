//! What a request asks of the API server, named as Kubernetes names it for RBAC and audit (its `RequestInfo`):
//! verb, resource (with subresource), namespace and name, from the method and the path alone.

use std::fmt;

use http::{Method, Uri};

/// A Kubernetes API verb.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verb {
    /// GET of one named object.
    Get,
    /// GET of a collection.
    List,
    /// GET with `watch=true` (or `watch=1`), or under the legacy `/watch/` prefix.
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH.
    Patch,
    /// DELETE of one named object.
    Delete,
    /// DELETE of a collection.
    DeleteCollection,
    /// Anything else (HEAD, OPTIONS, or a non-resource request other than GET).
    Other,
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
            Verb::Other => "other",
        })
    }
}

/// One request, classified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestInfo {
    /// The verb.
    pub verb: Verb,
    /// The plural resource, with its subresource after a slash (`pods/status`, `serviceaccounts/token`); empty for
    /// a non-resource request (`/readyz`, `/version`, discovery).
    pub resource: String,
    /// The namespace of a namespaced request.
    pub namespace: Option<String>,
    /// The object's name, when the request names one.
    pub name: Option<String>,
}

/// Subresources of a namespace: `/api/v1/namespaces/<name>/status` names a namespace, not a resource in it.
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

/// Classifies a request as kube-apiserver's `RequestInfoFactory` does.
pub fn classify(method: &Method, uri: &Uri) -> RequestInfo {
    let non_resource = || RequestInfo {
        verb: if method == Method::GET { Verb::Get } else { Verb::Other },
        resource: String::new(),
        namespace: None,
        name: None,
    };
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let mut rest: &[&str] = match segments.as_slice() {
        ["api", _version, rest @ ..] if !rest.is_empty() => rest,
        ["apis", _group, _version, rest @ ..] if !rest.is_empty() => rest,
        _ => return non_resource(),
    };
    let mut watch_prefix = false;
    if rest.first() == Some(&"watch") {
        watch_prefix = true;
        rest = &rest[1..];
    }
    let mut namespace = None;
    if rest.first() == Some(&"namespaces") && rest.len() > 1 {
        namespace = Some(rest[1].to_string());
        if rest.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&rest[2]) {
            rest = &rest[2..];
        }
    }
    let Some((&plural, after)) = rest.split_first() else { return non_resource() };
    let name = after.first().map(|s| s.to_string());
    let resource = match after.get(1) {
        Some(sub) => format!("{plural}/{sub}"),
        None => plural.to_string(),
    };
    let watch_query = uri
        .query()
        .is_some_and(|q| q.split('&').any(|kv| matches!(kv, "watch=true" | "watch=1" | "watch=True" | "watch")));
    let verb = match *method {
        Method::GET if watch_prefix || watch_query => Verb::Watch,
        Method::GET if name.is_some() => Verb::Get,
        Method::GET => Verb::List,
        Method::POST => Verb::Create,
        Method::PUT => Verb::Update,
        Method::PATCH => Verb::Patch,
        Method::DELETE if name.is_some() => Verb::Delete,
        Method::DELETE => Verb::DeleteCollection,
        _ => Verb::Other,
    };
    RequestInfo { verb, resource, namespace, name }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: Method, uri: &str) -> (Verb, String, Option<String>, Option<String>) {
        let i = classify(&method, &uri.parse().unwrap());
        (i.verb, i.resource, i.namespace, i.name)
    }

    fn s(v: &str) -> Option<String> {
        Some(v.to_string())
    }

    #[test]
    fn custom_resources() {
        let base = "/apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/ns1";
        assert_eq!(info(Method::GET, &format!("{base}/ippools")), (Verb::List, "ippools".into(), s("ns1"), None));
        assert_eq!(
            info(Method::GET, &format!("{base}/ippools/10.0.0.0-24")),
            (Verb::Get, "ippools".into(), s("ns1"), s("10.0.0.0-24"))
        );
        assert_eq!(
            info(Method::PATCH, &format!("{base}/ippools/p?fieldManager=x")),
            (Verb::Patch, "ippools".into(), s("ns1"), s("p"))
        );
        assert_eq!(
            info(Method::POST, &format!("{base}/overlappingrangeipreservations?")),
            (Verb::Create, "overlappingrangeipreservations".into(), s("ns1"), None)
        );
        assert_eq!(
            info(Method::DELETE, &format!("{base}/overlappingrangeipreservations/10.0.0.5")),
            (Verb::Delete, "overlappingrangeipreservations".into(), s("ns1"), s("10.0.0.5"))
        );
        assert_eq!(info(Method::DELETE, &format!("{base}/ippools")).0, Verb::DeleteCollection);
        assert_eq!(info(Method::PUT, &format!("{base}/ippools/p")).0, Verb::Update);
        assert_eq!(
            info(Method::GET, "/apis/whereabouts.cni.cncf.io/v1alpha1/ippools?watch=true&resourceVersion=5"),
            (Verb::Watch, "ippools".into(), None, None)
        );
    }

    #[test]
    fn core_resources_and_subresources() {
        assert_eq!(info(Method::GET, "/api/v1/pods?watch=1"), (Verb::Watch, "pods".into(), None, None));
        assert_eq!(
            info(Method::GET, "/api/v1/watch/namespaces/a/pods/p"),
            (Verb::Watch, "pods".into(), s("a"), s("p"))
        );
        assert_eq!(
            info(Method::POST, "/api/v1/namespaces/kube-system/serviceaccounts/hereabouts/token"),
            (Verb::Create, "serviceaccounts/token".into(), s("kube-system"), s("hereabouts"))
        );
        assert_eq!(
            info(Method::PUT, "/api/v1/namespaces/a/pods/p/status"),
            (Verb::Update, "pods/status".into(), s("a"), s("p"))
        );
        assert_eq!(
            info(Method::GET, "/apis/coordination.k8s.io/v1/namespaces/a/leases/l"),
            (Verb::Get, "leases".into(), s("a"), s("l"))
        );
    }

    #[test]
    fn a_namespace_is_its_own_namespace() {
        // as in Kubernetes' RequestInfo, which RBAC and audit see
        assert_eq!(info(Method::GET, "/api/v1/namespaces"), (Verb::List, "namespaces".into(), None, None));
        assert_eq!(info(Method::GET, "/api/v1/namespaces/a"), (Verb::Get, "namespaces".into(), s("a"), s("a")));
        assert_eq!(
            info(Method::PUT, "/api/v1/namespaces/a/finalize"),
            (Verb::Update, "namespaces/finalize".into(), s("a"), s("a"))
        );
        assert_eq!(info(Method::GET, "/api/v1/namespaces/a/pods"), (Verb::List, "pods".into(), s("a"), None));
    }

    #[test]
    fn non_resource_requests() {
        for path in ["/readyz", "/version", "/api", "/api/v1", "/apis", "/apis/whereabouts.cni.cncf.io/v1alpha1"] {
            assert_eq!(info(Method::GET, path), (Verb::Get, String::new(), None, None), "{path}");
        }
        assert_eq!(info(Method::POST, "/readyz").0, Verb::Other);
    }
}
