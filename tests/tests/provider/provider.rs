//! The IaaS provider client against the reference provider, over real HTTPS on loopback: the budget header, the
//! provider's refusal of a budget below its worst case without taking a token, the two timeout messages, verified
//! TLS, status codes, idempotent release.

use std::time::Duration;

use hereabouts_ipam::budget::Budget;
use hereabouts_ipam::codes::Code;
use hereabouts_ipam::config::provider;
use hereabouts_ipam::provider::{
    ALLOCATE_PATH, AllocateRequest, ProviderClient, ProviderError, RELEASE_PATH, ReleaseRequest, SubEniRequest,
};
use hereabouts_tests::provider::{Fault, ProviderOptions, ReferenceProvider};
use serde_json::json;

fn client(provider: &ReferenceProvider, timeout: &str) -> ProviderClient {
    client_trusting(provider, &provider.ca_file(), timeout)
}

fn client_trusting(provider: &ReferenceProvider, ca: &std::path::Path, timeout: &str) -> ProviderClient {
    let section = json!({
        "url": provider.url(), "ca_file": ca, "parent_interface": "eth1", "http_request_timeout": timeout,
    });
    let config = provider::parse(section.as_object().unwrap(), Duration::from_secs(90)).unwrap();
    ProviderClient::new(&config).unwrap()
}

fn allocate_one(ip: &str) -> AllocateRequest {
    AllocateRequest {
        pod_name: "web-0".into(),
        pod_namespace: "default".into(),
        pod_uid: "9f8b7c6d-0000-4000-8000-000000000001".into(),
        node_name: "node-a".into(),
        sub_eni_requests: vec![SubEniRequest {
            parent_nic_mac: "fa:16:3e:11:22:33".into(),
            subnet: "198.18.0.0/24".into(),
            ipv4_address: ip.into(),
            ipv4_pool_name: "198.18.0.0-24".into(),
            ..SubEniRequest::default()
        }],
    }
}

fn release_one(ip: &str) -> ReleaseRequest {
    ReleaseRequest {
        node_name: "node-a".into(),
        subnet: "198.18.0.0/24".into(),
        ip_address: ip.into(),
        ..ReleaseRequest::default()
    }
}

/// `X-Request-Timeout-Ms` is what is left of the call's deadline just before sending: the invocation's when it
/// ends first, shrinking with time already spent; `http_request_timeout` when that ends first.
#[tokio::test]
async fn the_budget_header_is_the_calls_remaining_deadline() {
    let provider = ReferenceProvider::start(ProviderOptions::default()).await;
    let invocation = Budget::new(Duration::from_secs(5));
    let c = client(&provider, "10s");
    c.allocate(&allocate_one("198.18.0.10"), &invocation).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    c.allocate(&allocate_one("198.18.0.11"), &invocation).await.unwrap();
    client(&provider, "2s")
        .allocate(&allocate_one("198.18.0.12"), &Budget::new(Duration::from_secs(60)))
        .await
        .unwrap();
    let sent: Vec<u64> = provider.calls().iter().map(|c| c.budget_ms.expect("a positive integer")).collect();
    assert!(sent[0] <= 5000 && sent[0] > 4000, "the invocation's 5 s, nearly whole: {sent:?}");
    assert!(sent[1] <= 3500 && sent[1] > 2500, "1.5 s later, 1.5 s less: {sent:?}");
    assert!(sent[2] <= 2000 && sent[2] > 1000, "http_request_timeout when it ends first: {sent:?}");
}

/// A budget below the provider's worst case (queue wait + cloud delay) is refused before a rate-limit token is
/// taken; the client reports it as retryable (code 11) with the provider's reason.
#[tokio::test]
async fn a_budget_below_the_providers_worst_case_is_refused_without_taking_a_token() {
    let options = ProviderOptions { max_queue_wait: Duration::from_secs(2), ..ProviderOptions::default() };
    let provider = ReferenceProvider::start(options.clone()).await;
    let err = client(&provider, "10s")
        .allocate(&allocate_one("198.18.0.10"), &Budget::new(Duration::from_secs(1)))
        .await
        .unwrap_err();
    assert!(matches!(err, ProviderError::Refused { status: 429, .. }), "{err}");
    assert_eq!(err.code(), Code::TryAgainLater);
    assert!(err.to_string().contains("below the provider's worst case 2020 ms"), "{err}");
    let calls = provider.calls();
    assert_eq!(calls.len(), 1);
    assert!(!calls[0].took_token, "refused before a token was taken");
    assert!(provider.sub_enis().is_empty());
    assert!(provider.tokens(&options) > f64::from(options.burst) - 0.5, "the bucket is full");
    // with the budget above the worst case, the same request goes through and takes a token
    client(&provider, "10s")
        .allocate(&allocate_one("198.18.0.10"), &Budget::new(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(provider.calls()[1].took_token);
}

/// The seed's two timeout messages, code 11 both: the configured timeout ends first, or the invocation's budget.
#[tokio::test]
async fn each_timeout_says_which_deadline_ended_the_call() {
    let provider = ReferenceProvider::start(ProviderOptions::default()).await;
    provider.inject(Fault::Hang);
    let err = client(&provider, "1s")
        .allocate(&allocate_one("198.18.0.10"), &Budget::new(Duration::from_secs(30)))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("provider-interaction timeout: POST {}{ALLOCATE_PATH} exceeded configured timeout 1s", provider.url())
    );
    assert_eq!(err.code(), Code::TryAgainLater);

    provider.inject(Fault::Hang);
    let t0 = std::time::Instant::now();
    let err = client(&provider, "50s")
        .release(&release_one("198.18.0.10"), &Budget::new(Duration::from_millis(1200)))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("parent budget exhausted: POST {}{RELEASE_PATH} cancelled by parent context deadline", provider.url())
    );
    assert_eq!(err.code(), Code::TryAgainLater);
    assert!(t0.elapsed() < Duration::from_secs(3), "ended by the invocation's budget: {:?}", t0.elapsed());
}

/// The provider's certificate is checked against `ca_file` alone: a provider whose CA is another is refused with
/// a TLS error that says so (code 105), and nothing reaches it.
#[tokio::test]
async fn an_untrusted_provider_certificate_fails_the_call_clearly() {
    let provider = ReferenceProvider::start(ProviderOptions::default()).await;
    let other = ReferenceProvider::start(ProviderOptions::default()).await;
    let err = client_trusting(&provider, &other.ca_file(), "10s")
        .allocate(&allocate_one("198.18.0.10"), &Budget::new(Duration::from_secs(5)))
        .await
        .unwrap_err();
    assert!(matches!(err, ProviderError::Tls { .. }), "{err}");
    assert_eq!(err.code(), Code::ProviderRefused);
    let text = err.to_string();
    assert!(text.contains("invalid peer certificate") && text.contains("ca_file is the only trust"), "{text}");
    assert!(provider.calls().is_empty(), "no request was sent");

    let not_pem = provider.dir().join("not-a-ca.pem");
    std::fs::write(&not_pem, "not a certificate").unwrap();
    let section = json!({"url": provider.url(), "ca_file": not_pem, "parent_interface": "eth1"});
    let config = provider::parse(section.as_object().unwrap(), Duration::from_secs(90)).unwrap();
    let err = ProviderClient::new(&config).unwrap_err();
    assert_eq!(err.code(), Code::Io);
    assert!(err.to_string().contains("no certificate in it"), "{err}");
}

/// The answer's MAC and VLAN come back; release is idempotent; 429 and 5xx are retryable, other refusals not.
#[tokio::test]
async fn allocate_answers_release_is_idempotent_and_statuses_map_to_codes() {
    let provider = ReferenceProvider::start(ProviderOptions::default()).await;
    let c = client(&provider, "10s");
    let budget = Budget::new(Duration::from_secs(30));
    let answer = c.allocate(&allocate_one("198.18.0.10"), &budget).await.unwrap();
    assert_eq!(answer.sub_eni_responses.len(), 1);
    let eni = &answer.sub_eni_responses[0];
    assert_eq!(eni.ipv4_address, "198.18.0.10");
    assert!(eni.vlan_id.is_some() && !eni.mac_address.is_empty(), "{eni:?}");
    assert_eq!(provider.sub_enis()["198.18.0.10"].node, "node-a");

    c.release(&release_one("198.18.0.10"), &budget).await.unwrap();
    c.release(&release_one("198.18.0.10"), &budget).await.unwrap();
    assert!(provider.sub_enis().is_empty());
    let body = &provider.calls()[1].body;
    assert_eq!(body["ipAddress"], "198.18.0.10");
    assert_eq!(body["parentNicMac"], "", "an empty parentNicMac is sent as such (the cluster sweep cannot know it)");

    for (status, code) in [(503, Code::TryAgainLater), (500, Code::TryAgainLater), (400, Code::ProviderRefused)] {
        provider.inject(Fault::Status(status));
        let err = c.allocate(&allocate_one("198.18.0.11"), &budget).await.unwrap_err();
        assert!(matches!(err, ProviderError::Refused { status: s, .. } if s == status), "{err}");
        assert_eq!(err.code(), code, "{status}");
    }
    assert!(provider.sub_enis().is_empty(), "a refused allocation made nothing");
}
