"""The private JAX and orbax state bertjax reads, checked on the installed versions, so that an
upgrade that moves any of it fails here, loudly, instead of silently in a pod run.

- bertjax/training/processes.py and stopping.py: JAX has no public accessor for the
  coordination-service client or the preemption sync manager (`jax._src.distributed.global_state`),
  which multihost_utils and orbax read too; the watchdog calls the client's key-value store,
  barriers and live-node query.
- bertjax/training/checkpoint.py: orbax's ArrayHandler's replica-parallel switch and its array
  metadata store (`_use_replica_parallel`, `_array_metadata_store`), copied into the handler
  bertjax registers on CPU hosts (checkpoint_test.py checks what it does with them).
- bertjax/modeling/attention_kernels.py: cuDNN's version check behind jax.nn.dot_product_attention.
- bertjax/training/compile_cache.py: JAX's persistent compilation cache object and its lock
  (`jax._src.compilation_cache._cache`, ``_cache_initialized``, ``_cache_initialized_mutex``,
  `CacheInterface`), where bertjax puts its atomic cache (compile_cache_test.py checks the hits).
- bertjax/training/processes.py: the key JAX's preemption sync manager sets when a process gets
  SIGTERM (TSL's ``RECEIVED_PREEMPTION_NOTICE``, read with ``key_value_try_get``; the fault tier's
  stop during an outage fails without it).
"""

import inspect

import jax


def test_jax_s_distributed_state_holds_the_client_and_the_preemption_sync_manager():
    from jax._src import distributed

    state = distributed.global_state
    assert state is distributed.global_state  # one module-level object
    assert state.client is None and state.preemption_sync_manager is None  # not initialized
    assert not jax.distributed.is_initialized()
    assert "heartbeat_timeout_seconds" in inspect.signature(jax.distributed.initialize).parameters


def test_the_coordination_client_has_what_the_watchdog_and_exchange_call():
    from jax._src.lib import _jax

    client = _jax.DistributedRuntimeClient
    for method in ("get_live_nodes", "key_value_set", "key_value_dir_get", "key_value_delete",
                   "wait_at_barrier", "key_value_try_get"):  # fmt: skip
        assert callable(getattr(client, method, None)), method
    from jax.experimental import multihost_utils

    assert callable(multihost_utils.reached_preemption_sync_point)
    assert callable(multihost_utils.sync_global_devices)


def test_orbax_s_array_handler_keeps_its_replica_parallel_switch_and_metadata_store():
    from orbax.checkpoint import type_handlers

    handler = type_handlers.ArrayHandler(use_replica_parallel=True, array_metadata_store=None)
    assert handler._use_replica_parallel is True and handler._array_metadata_store is None
    parameters = inspect.signature(type_handlers.ArrayHandler).parameters
    assert {"use_replica_parallel", "array_metadata_store"} <= set(parameters)


def test_cudnn_s_version_check_is_where_the_kernel_table_imports_it():
    from jax._src.cudnn import fused_attention_stablehlo

    assert callable(fused_attention_stablehlo.check_cudnn_version)


def test_jax_s_compilation_cache_object_is_where_bertjax_puts_its_own():
    from jax._src import compilation_cache
    from jax._src.compilation_cache_interface import CacheInterface

    assert hasattr(compilation_cache, "_cache") and hasattr(compilation_cache, "_cache_initialized")
    assert callable(compilation_cache.reset_cache)
    with compilation_cache._cache_initialized_mutex:
        pass
    assert {"get", "put"} <= set(vars(CacheInterface))
