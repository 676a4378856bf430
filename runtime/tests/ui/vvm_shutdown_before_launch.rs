use vvm_core::VvmConfig;
use vvm_runtime::{LeaseStore, Services, Vvm};

async fn host<S: LeaseStore>(store: S) {
    let config = VvmConfig::builder("10.0.0.1:7000");
    let vvm = Vvm::provide(config, store, Services::new()).unwrap();
    let _ = vvm.shutdown().await;
}

fn main() {}
