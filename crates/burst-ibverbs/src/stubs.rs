//! Entry points burst does not implement: every other public symbol of
//! rdma-core 44's libibverbs.so.1 (with its 1.0 compat aliases and the
//! IBVERBS_PRIVATE_34 provider interface) and librdmacm.so.1, so that any
//! application linked against them loads (they are all BIND_NOW). Each
//! fails the way its C signature reports errors: EOPNOTSUPP for verbs,
//! ENOSYS for the parts of librdmacm burst does not implement (the ECE
//! calls, extended SRQs).
//!
//! The list was generated from `objdump -T` of Debian 12's libraries; the
//! step `cargo xtask dropin` checks the built library against them
//! (`rdma-core-44-exports.txt`).

stubs! { libc::EOPNOTSUPP;
    s_ibv_resolve_eth_l2_from_gid = "ibv_resolve_eth_l2_from_gid" @ "IBVERBS_1.1" => Errno;
    s_ibv_copy_path_rec_from_kern = "ibv_copy_path_rec_from_kern" @ "IBVERBS_1.0" => Void;
    s_ibv_import_device = "ibv_import_device" @ "IBVERBS_1.10" => Null;
    c_ibv_ack_async_event = "ibv_ack_async_event" @ "IBVERBS_1.0" (compat) => Void;
    s_verbs_uninit_context = "verbs_uninit_context" @ "IBVERBS_PRIVATE_34" => Void;
    s_ibv_cmd_create_counters = "ibv_cmd_create_counters" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_dealloc_mw = "ibv_cmd_dealloc_mw" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_unimport_mr = "ibv_unimport_mr" @ "IBVERBS_1.10" => Void;
    s_ibv_copy_qp_attr_from_kern = "ibv_copy_qp_attr_from_kern" @ "IBVERBS_1.0" => Void;
    s_verbs_init_and_alloc_context = "_verbs_init_and_alloc_context" @ "IBVERBS_PRIVATE_34" => Null;
    c_ibv_get_device_guid = "ibv_get_device_guid" @ "IBVERBS_1.0" (compat) => Errno;
    s_ibv_cmd_modify_qp_ex = "ibv_cmd_modify_qp_ex" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_import_mr = "ibv_import_mr" @ "IBVERBS_1.10" => Null;
    s_ibv_cmd_reg_dm_mr = "ibv_cmd_reg_dm_mr" @ "IBVERBS_PRIVATE_34" => Errno;
    c_ibv_get_device_name = "ibv_get_device_name" @ "IBVERBS_1.0" (compat) => Null;
    s_ioctl_final_num_attrs = "__ioctl_final_num_attrs" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_create_flow_action_esp = "ibv_cmd_create_flow_action_esp" @ "IBVERBS_PRIVATE_34" => Errno;
    c_ibv_free_device_list = "ibv_free_device_list" @ "IBVERBS_1.0" (compat) => Void;
    s_ibv_cmd_open_qp = "ibv_cmd_open_qp" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_query_context = "ibv_cmd_query_context" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_destroy_ah = "ibv_cmd_destroy_ah" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_advise_mr = "ibv_cmd_advise_mr" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_rereg_mr = "ibv_cmd_rereg_mr" @ "IBVERBS_PRIVATE_34" => Errno;
    s_execute_ioctl = "execute_ioctl" @ "IBVERBS_PRIVATE_34" => Errno;
    c_ibv_query_pkey = "ibv_query_pkey" @ "IBVERBS_1.0" (compat) => Errno;
    s_ibv_cmd_alloc_mw = "ibv_cmd_alloc_mw" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_copy_path_rec_to_kern = "ibv_copy_path_rec_to_kern" @ "IBVERBS_1.0" => Void;
    s_ibv_cmd_read_counters = "ibv_cmd_read_counters" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_create_cq_ex = "ibv_cmd_create_cq_ex" @ "IBVERBS_PRIVATE_34" => Errno;
    s_verbs_set_ops = "verbs_set_ops" @ "IBVERBS_PRIVATE_34" => Void;
    s_ibv_cmd_req_notify_cq = "ibv_cmd_req_notify_cq" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_modify_cq = "ibv_cmd_modify_cq" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_destroy_qp = "ibv_cmd_destroy_qp" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_modify_wq = "ibv_cmd_modify_wq" @ "IBVERBS_PRIVATE_34" => Errno;
    s_verbs_open_device = "verbs_open_device" @ "IBVERBS_PRIVATE_34" => Null;
    s_ibv_cmd_destroy_flow_action = "ibv_cmd_destroy_flow_action" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_post_send = "ibv_cmd_post_send" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_reg_mr = "ibv_cmd_reg_mr" @ "IBVERBS_PRIVATE_34" => Errno;
    s_verbs_init_cq = "verbs_init_cq" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_get_sysfs_path = "ibv_get_sysfs_path" @ "IBVERBS_1.0" => Null;
    s_ibv_cmd_post_recv = "ibv_cmd_post_recv" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_query_qp = "ibv_cmd_query_qp" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_query_mr = "ibv_cmd_query_mr" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_destroy_flow = "ibv_cmd_destroy_flow" @ "IBVERBS_PRIVATE_34" => Errno;
    c_ibv_create_cq = "ibv_create_cq" @ "IBVERBS_1.0" (compat) => Null;
    c_ibv_close_device = "ibv_close_device" @ "IBVERBS_1.0" (compat) => Errno;
    c_ibv_destroy_ah = "ibv_destroy_ah" @ "IBVERBS_1.0" (compat) => Errno;
    s_ibv_cmd_query_port = "ibv_cmd_query_port" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_read_ibdev_sysfs_file = "ibv_read_ibdev_sysfs_file" @ "IBVERBS_PRIVATE_34" => Minus1;
    s_ibv_cmd_post_srq_recv = "ibv_cmd_post_srq_recv" @ "IBVERBS_PRIVATE_34" => Errno;
    c_ibv_query_gid = "ibv_query_gid" @ "IBVERBS_1.0" (compat) => Errno;
    s_ibv_cmd_dereg_mr = "ibv_cmd_dereg_mr" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_get_context = "ibv_cmd_get_context" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_create_srq = "ibv_cmd_create_srq" @ "IBVERBS_PRIVATE_34" => Errno;
    c_ibv_get_cq_event = "ibv_get_cq_event" @ "IBVERBS_1.0" (compat) => Minus1;
    s_ibv_cmd_destroy_counters = "ibv_cmd_destroy_counters" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_create_cq = "ibv_cmd_create_cq" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_destroy_rwq_ind_table = "ibv_cmd_destroy_rwq_ind_table" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_create_flow = "ibv_cmd_create_flow" @ "IBVERBS_PRIVATE_34" => Errno;
    c_ibv_query_qp = "ibv_query_qp" @ "IBVERBS_1.0" (compat) => Errno;
    s_ibv_cmd_modify_flow_action_esp = "ibv_cmd_modify_flow_action_esp" @ "IBVERBS_PRIVATE_34" => Errno;
    c_ibv_destroy_qp = "ibv_destroy_qp" @ "IBVERBS_1.0" (compat) => Errno;
    c_ibv_reg_mr = "ibv_reg_mr" @ "IBVERBS_1.0" (compat) => Null;
    s_ibv_cmd_close_xrcd = "ibv_cmd_close_xrcd" @ "IBVERBS_PRIVATE_34" => Errno;
    c_ibv_resize_cq = "ibv_resize_cq" @ "IBVERBS_1.0" (compat) => Errno;
    c_ibv_destroy_srq = "ibv_destroy_srq" @ "IBVERBS_1.0" (compat) => Errno;
    s_ibv_cmd_create_wq = "ibv_cmd_create_wq" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_create_qp_ex = "ibv_cmd_create_qp_ex" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_create_rwq_ind_table = "ibv_cmd_create_rwq_ind_table" @ "IBVERBS_PRIVATE_34" => Errno;
    c_ibv_query_srq = "ibv_query_srq" @ "IBVERBS_1.0" (compat) => Errno;
    s_ibv_cmd_poll_cq = "ibv_cmd_poll_cq" @ "IBVERBS_PRIVATE_34" => Errno;
    c_ibv_dereg_mr = "ibv_dereg_mr" @ "IBVERBS_1.0" (compat) => Errno;
    s_ibv_cmd_free_dm = "ibv_cmd_free_dm" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_modify_srq = "ibv_cmd_modify_srq" @ "IBVERBS_PRIVATE_34" => Errno;
    c_ibv_detach_mcast = "ibv_detach_mcast" @ "IBVERBS_1.0" (compat) => Errno;
    s_ibv_cmd_create_qp_ex2 = "ibv_cmd_create_qp_ex2" @ "IBVERBS_PRIVATE_34" => Errno;
    c_ibv_register_driver = "ibv_register_driver" @ "IBVERBS_1.1" (compat) => Void;
    c_ibv_get_device_list = "ibv_get_device_list" @ "IBVERBS_1.0" (compat) => Null;
    s_ibv_cmd_resize_cq = "ibv_cmd_resize_cq" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_query_srq = "ibv_cmd_query_srq" @ "IBVERBS_PRIVATE_34" => Errno;
    c_ibv_modify_qp = "ibv_modify_qp" @ "IBVERBS_1.0" (compat) => Errno;
    s_ibv_copy_ah_attr_from_kern = "ibv_copy_ah_attr_from_kern" @ "IBVERBS_1.1" => Void;
    s_ibv_cmd_dealloc_pd = "ibv_cmd_dealloc_pd" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_detach_mcast = "ibv_cmd_detach_mcast" @ "IBVERBS_PRIVATE_34" => Errno;
    c_ibv_ack_cq_events = "ibv_ack_cq_events" @ "IBVERBS_1.0" (compat) => Void;
    c_ibv_query_port = "ibv_query_port" @ "IBVERBS_1.0" (compat) => Errno;
    s_ibv_cmd_open_xrcd = "ibv_cmd_open_xrcd" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_unimport_pd = "ibv_unimport_pd" @ "IBVERBS_1.10" => Void;
    c_ibv_create_srq = "ibv_create_srq" @ "IBVERBS_1.0" (compat) => Null;
    s_ibv_cmd_destroy_cq = "ibv_cmd_destroy_cq" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_import_pd = "ibv_import_pd" @ "IBVERBS_1.10" => Null;
    s_ibv_unimport_dm = "ibv_unimport_dm" @ "IBVERBS_1.13" => Void;
    s_ibv_cmd_modify_qp = "ibv_cmd_modify_qp" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_destroy_wq = "ibv_cmd_destroy_wq" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_import_dm = "ibv_import_dm" @ "IBVERBS_1.13" => Null;
    c_ibv_get_async_event = "ibv_get_async_event" @ "IBVERBS_1.0" (compat) => Minus1;
    c_ibv_create_ah = "ibv_create_ah" @ "IBVERBS_1.0" (compat) => Null;
    s_ibv_cmd_alloc_pd = "ibv_cmd_alloc_pd" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_query_device_any = "ibv_cmd_query_device_any" @ "IBVERBS_PRIVATE_34" => Errno;
    c_ibv_modify_srq = "ibv_modify_srq" @ "IBVERBS_1.0" (compat) => Errno;
    s_ibv_cmd_alloc_dm = "ibv_cmd_alloc_dm" @ "IBVERBS_PRIVATE_34" => Errno;
    c_ibv_attach_mcast = "ibv_attach_mcast" @ "IBVERBS_1.0" (compat) => Errno;
    c_ibv_create_qp = "ibv_create_qp" @ "IBVERBS_1.0" (compat) => Null;
    s_ibv_cmd_create_ah = "ibv_cmd_create_ah" @ "IBVERBS_PRIVATE_34" => Errno;
    c_ibv_query_device = "ibv_query_device" @ "IBVERBS_1.0" (compat) => Errno;
    c_ibv_dealloc_pd = "ibv_dealloc_pd" @ "IBVERBS_1.0" (compat) => Errno;
    s_ibv_cmd_attach_mcast = "ibv_cmd_attach_mcast" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_cmd_destroy_srq = "ibv_cmd_destroy_srq" @ "IBVERBS_PRIVATE_34" => Errno;
    s_ibv_reg_dmabuf_mr = "ibv_reg_dmabuf_mr" @ "IBVERBS_1.12" => Null;
    s_ibv_cmd_create_srq_ex = "ibv_cmd_create_srq_ex" @ "IBVERBS_PRIVATE_34" => Errno;
    c_ibv_alloc_pd = "ibv_alloc_pd" @ "IBVERBS_1.0" (compat) => Null;
    c_ibv_destroy_cq = "ibv_destroy_cq" @ "IBVERBS_1.0" (compat) => Errno;
    s_ibv_cmd_create_qp = "ibv_cmd_create_qp" @ "IBVERBS_PRIVATE_34" => Errno;
    c_ibv_open_device = "ibv_open_device" @ "IBVERBS_1.0" (compat) => Null;
    s_ibv_cmd_reg_dmabuf_mr = "ibv_cmd_reg_dmabuf_mr" @ "IBVERBS_PRIVATE_34" => Errno;
}

stubs! { libc::ENOSYS;
    s_rdma_create_srq_ex = "rdma_create_srq_ex" @ "RDMACM_1.0" => Minus1;
}
