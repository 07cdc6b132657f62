"""pytest plugin (-p peers_torch_compat): the one name that the carried
test_cuda.py imports and torch 2.11's torch.testing._internal lacks.

The carried test_cuda.py comes from a PyTorch revision after v2.11.0 (the
tag's file was not reachable when .peers/ was made: torch-tests/SOURCE), where
TEST_CUDAMALLOCASYNC moved from test_cuda.py into common_utils. It is defined
here as test_cuda.py defined it before the move, only where common_utils lacks
it, so that the file's text stays as PyTorch wrote it.
"""
import torch
from torch.testing._internal import common_utils

if not hasattr(common_utils, "TEST_CUDAMALLOCASYNC"):
    common_utils.TEST_CUDAMALLOCASYNC = common_utils.TEST_CUDA and (
        torch.cuda.get_allocator_backend() == "cudaMallocAsync"
    )
