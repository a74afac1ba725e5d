# A GPU batch is handed its leased GPUs by UUID, in PCI order.
case "${CUDA_VISIBLE_DEVICES:-}" in GPU-*) ;; *) exit 1 ;; esac
[ "${CUDA_DEVICE_ORDER:-}" = PCI_BUS_ID ]
