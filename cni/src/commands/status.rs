use hereabouts_ipam::budget::Budget;
use hereabouts_ipam::codes::Code;
use hereabouts_ipam::store::Store;

use crate::error::CniError;

/// Ready when the API server answers a list of pools in our namespace (so both reachability and RBAC hold).
pub async fn run(store: &impl Store, budget: &Budget) -> Result<(), CniError> {
    match budget.run(store.probe()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(CniError::new(Code::NotAvailable, e.to_string())),
        Err(e) => Err(CniError::new(Code::NotAvailable, e.to_string())),
    }
}
