"""The CUDA backend: kernel builds (NVRTC → fatbin), the driver facade (the only pycuda importer) and runners.

Importing this package never needs pycuda, NVRTC or a GPU: each module loads what it needs when used.
"""
