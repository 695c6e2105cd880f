#include "backends/backend.h"

namespace meshrt::backend {

Buffer::~Buffer() { backend_->deallocate(device_, data_, bytes_); }

}  // namespace meshrt::backend
