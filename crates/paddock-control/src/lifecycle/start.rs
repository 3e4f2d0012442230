//! Starting the service: checking the configuration, recovery's first phase, and the background
//! tasks (recovery's second phase, the reaper, warm-pool fillers, the network audit).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use paddock_runtime::AnyBackend;
use paddock_store::Store;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::core::live::lock;
use crate::core::metrics::Metrics;
use crate::core::service::{Inner, SandboxService};
use crate::{ServiceConfig, ServiceError};

impl SandboxService {
    /// Starts the service: re-adopts live sandboxes recorded in the store, reclaims dead ones, starts
    /// the warm-pool fillers and the reaper. Call from a multi-threaded tokio runtime.
    pub async fn start(
        config: ServiceConfig,
        backend: AnyBackend,
        store: Store,
    ) -> Result<Self, ServiceError> {
        if !config
            .templates
            .contains_key(crate::plan::create::DEFAULT_TEMPLATE)
        {
            return Err(ServiceError::invalid(
                "templates",
                "the `default` template must be configured",
            ));
        }
        // Every sandbox asking for nothing gets the defaults: they must be within the bounds too.
        crate::plan::create::check_limits(&config.default_limits, &config.max_limits).map_err(|mut e| {
            e.field = e.field.map(|f| format!("default_{f}"));
            e
        })?;
        let metrics = Metrics::new();
        let (egress, egress_audit) = match &config.network {
            Some(network) => {
                let (sink, rx) =
                    crate::lifecycle::network_audit::NetworkAuditSink::new(metrics.audit().clone());
                let egress = paddock_egress::Egress::new(network.egress.clone(), sink.clone())
                    .map_err(|e| ServiceError::invalid("egress", e.to_string()))?;
                (Some(Arc::new(egress)), Some((rx, sink)))
            }
            None => (None, None),
        };
        let collect_budget = crate::core::output::collect::OutputBudget::new(config.collect_budget_bytes);
        let port_audit = crate::core::audit::ports::PortAudit::new(config.ports.clone());
        let service = Self {
            inner: Arc::new(Inner {
                egress,
                served: Mutex::new(HashMap::new()),
                config,
                backend: Arc::new(backend),
                store: Arc::new(store),
                live: Mutex::new(HashMap::new()),
                metrics,
                pool_wakeup: Notify::new(),
                activity: crate::core::activity::Activity::new(),
                stop: CancellationToken::new(),
                tasks: Mutex::new(Vec::new()),
                collect_budget,
                recovering: Mutex::new(HashSet::new()),
                recovered: CancellationToken::new(),
                port_gate: Arc::default(),
                port_audit: Mutex::new(port_audit),
                built_templates: Mutex::new(HashMap::new()),
                approvals: crate::core::approval_state::Queue::new(),
                policies: Default::default(),
                executions: Default::default(),
            }),
        };
        if let Some(egress) = &service.inner.egress {
            egress.set_asker(Arc::new(crate::core::approvals::network::NetworkAsk(
                Arc::downgrade(&service.inner),
            )));
        }
        let mut tasks = Vec::new();
        if let Some((rx, sink)) = egress_audit {
            tasks.push(tokio::spawn(service.clone().run_network_audit(rx, sink)));
        }
        // Retention also runs without an egress proxy: a server that had one may have left rows.
        tasks.push(tokio::spawn(service.clone().run_audit_retention()));
        tasks.push(tokio::spawn(service.clone().run_port_audit()));
        tasks.push(tokio::spawn(service.clone().run_executions()));
        // What must be done before a request can make storage; the sandboxes themselves are
        // recovered while the API serves (`recovery.rs`).
        let recovery = service.begin_recovery().await?;
        tasks.push(tokio::spawn(service.clone().finish_recovery(recovery)));
        tasks.push(tokio::spawn(service.clone().run_reaper()));
        for (name, template) in &service.inner.config.templates {
            if template.warm_pool_size > 0 {
                // Warm sandboxes from before the restart count once recovered.
                let (filler, name) = (service.clone(), name.clone());
                tasks.push(tokio::spawn(async move {
                    tokio::select! {
                        () = filler.inner.stop.cancelled() => return,
                        () = filler.inner.recovered.cancelled() => {}
                    }
                    filler.run_pool_filler(name).await;
                }));
            }
        }
        *lock(&service.inner.tasks) = tasks;
        Ok(service)
    }
}
