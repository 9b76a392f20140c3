//! The API relay over 127.0.0.1: a call reaches the host's `CohortApi` with its
//! method, path and body and comes back with its status and body; a wrong token, a
//! malformed call and a cohort without an API are refused; a slow call does not
//! hold up a restore on the same cohort.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rebound_coord::relay::{self, ApiAnswer, CohortApi, RelayConfig, RelayError};
use rebound_coord::wire::WireError;
use rebound_coord::{restore, spawn_cohort_with_api, Plan};
use tokio::net::TcpListener;

use crate::common::{cohort, other_token, quick, quick_cohort, token, StandInVms};
use crate::restore::vm;

/// Answers every call with what it got, after `delay`.
struct Echo {
    delay: Duration,
    calls: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl CohortApi for Echo {
    async fn call(&self, method: &str, path: &str, body: Option<serde_json::Value>) -> ApiAnswer {
        self.calls.lock().unwrap().push(format!("{method} {path}"));
        tokio::time::sleep(self.delay).await;
        ApiAnswer {
            status: 201,
            body: serde_json::json!({"method": method, "path": path, "body": body}),
        }
    }
}

async fn relay_cohort(delay: Duration) -> (rebound_coord::CohortHandle, Arc<Echo>) {
    let echo = Arc::new(Echo {
        delay,
        calls: Mutex::new(Vec::new()),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let h = spawn_cohort_with_api(
        listener,
        token(),
        StandInVms::new(&[]),
        echo.clone(),
        quick_cohort(),
    )
    .unwrap();
    (h, echo)
}

#[tokio::test]
async fn calls_are_relayed_and_strangers_refused() {
    let (h, echo) = relay_cohort(Duration::ZERO).await;
    let addr = h.local_addr().to_string();
    let body = serde_json::json!({"name": "a"});
    let a = relay::call(&addr, &token(), "POST", "/v1/vms?x=1", Some(&body))
        .await
        .unwrap();
    assert_eq!(a.status, 201);
    assert_eq!(a.body["method"], "POST");
    assert_eq!(a.body["path"], "/v1/vms?x=1");
    assert_eq!(a.body["body"], body);

    let e = relay::call(&addr, &other_token(), "GET", "/v1/vms", None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            RelayError::Wire {
                source: WireError::NotAuthenticated,
                ..
            }
        ),
        "{e}"
    );
    let e = relay::call(&addr, &token(), "GET", "/v1/../etc", None)
        .await
        .unwrap_err();
    assert!(matches!(e, RelayError::BadCall(_)), "{e}");
    assert_eq!(
        echo.calls.lock().unwrap().len(),
        1,
        "only the good call ran"
    );

    // A cohort without an API says so.
    let plain = cohort(StandInVms::new(&[]), token()).await;
    let a = relay::call(
        &plain.local_addr().to_string(),
        &token(),
        "GET",
        "/v1/vms",
        None,
    )
    .await
    .unwrap();
    assert_eq!(a.status, 501, "{a:?}");
    assert!(a.body["error"].as_str().unwrap().contains("no API relay"));
}

#[tokio::test]
async fn a_slow_call_times_out_at_the_client_and_holds_up_no_restore() {
    let (h, _echo) = relay_cohort(Duration::from_secs(3)).await;
    let addr = h.local_addr().to_string();
    let quick_reply = RelayConfig {
        reply: Duration::from_millis(300),
        ..RelayConfig::default()
    };
    let slow = {
        let addr = addr.clone();
        tokio::spawn(async move {
            relay::call_with(&addr, &token(), "GET", "/v1/vms", None, &quick_reply).await
        })
    };
    let plan = Plan {
        restore_id: "relay-busy".into(),
        vms: vec![vm("a", h.local_addr(), &[])],
    };
    let report = restore(&plan, &token(), &quick()).await.unwrap();
    assert_eq!(
        report.outcome,
        rebound_coord::report::Outcome::Restored,
        "{report:?}"
    );
    let e = slow.await.unwrap().unwrap_err();
    assert!(matches!(e, RelayError::ReplyTimeout { .. }), "{e}");
}
