from __future__ import print_function
from __future__ import division

from .layers import *
from .models import *
from .utils import *