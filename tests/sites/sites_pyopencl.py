"""PyOpenCL, unmodified, allocating at known lines of this file through
its own layers (pyopencl.array's Array.__init__ and to_device, and
cl.Buffer directly), on PoCL; the three buffers are held together until
Python's exit releases them.

usage: sites_pyopencl.py"""
import numpy as np
import pyopencl as cl
import pyopencl.array as cla

ctx = cl.Context([cl.get_platforms()[0].get_devices()[0]])
queue = cl.CommandQueue(ctx)


def load_weights():
    return cla.to_device(queue, np.ones(1 << 18, np.float32))  # WEIGHTS: 1 MiB


def make_scratch():
    return cla.zeros(queue, 1 << 19, np.float32)  # SCRATCH: 2 MiB


def raw_buffer():
    return cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 3 << 20)  # RAW: 3 MiB


kept = [load_weights(), make_scratch(), raw_buffer()]
queue.finish()
print("done", flush=True)
