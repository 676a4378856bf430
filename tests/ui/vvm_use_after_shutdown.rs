use vvm::{Services, Vvm, VvmConfig};
use vvm_adapters::MemoryStore;

async fn host() {
    let config = VvmConfig::builder("10.0.0.1:7000");
    let vvm = Vvm::provide(config, MemoryStore::new(), Services::new()).unwrap();
    let vvm = vvm.launch().await;
    let _ = vvm.shutdown().await;
    let _ = vvm.problem().await;
}

fn main() {
    let _ = host();
}
