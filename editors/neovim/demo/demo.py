import os


def list_python_files(root):
    """Return the paths of all .py files under root, sorted."""
    result = []
    for dirpath, dirnames, filenames in os.walk(root):
        
