use vvm_core::VvmConfig;
use vvm_runtime::{LeaseStore, Services, Vvm};

async fn host<S: LeaseStore>(store: S) {
    let config = VvmConfig::builder("10.0.0.1:7000");
    let vvm = Vvm::provide(config, store, Services::new()).unwrap();
    let vvm = vvm.launch().await;
    let _ = vvm.shutdown().await;
    let _ = vvm.problem().await;
}

fn main() {}
