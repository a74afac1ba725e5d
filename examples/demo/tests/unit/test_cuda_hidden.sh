# CPU batches see no GPU.
[ "${CUDA_VISIBLE_DEVICES-unset}" = "" ]
